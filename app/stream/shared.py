"""Readings of the write queue's memory, encoded once per partition change for every connection.

Theory of operation
-------------------
A shared pass (``engine.protocol.shared_pass``) needs, for each visit, the messages a visit from
``after`` would send now.  ``SharedReadings.reading`` returns them from a table keyed by
``(codec, partition, after)``: the first connection to ask after a write reads the partition's
new items from the write queue (``Engine.memory_snapshot``: one attribute read of an immutable
root, no LMDB, so it runs on the event loop), encodes them exactly as its own visit would
(``PartitionCursor.produce``) and lays them out as bundle parts; every other connection at the
same position gets the same object.  An entry is used only while the partition's high seqno still
equals its end: a newer write makes it stale, and the next asker reads again (the readings of a
connection's visit are therefore as fresh as its own snapshot would be, which barrier cookies
rely on).

Readings are offered only when they are small: at most ``max_items`` seqnos, all still in the
write queue's memory.  A position further behind gets None and its connection reads for itself
(a reader-thread job, which also shares encoded parts through the ``TailCache``); the readings
made here are stored in that cache too, so such a connection catches up on them.

Bounded by ``max_bytes`` of encoded parts (oldest entries dropped first).  Event loop only.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from app.stream.cursor import Batch, BatchEncoder, Marker, PartitionCursor
from app.stream.tailcache import TailCache
from engine.protocol.bundle import encode_parts
from engine.protocol.shared_pass import BatchStep, MarkerStep, SharedReading, idle_reading

__all__ = ["SharedReadings"]


class SharedReadings:
    def __init__(self, engine: Any, encoders: dict[str, BatchEncoder], cache: TailCache | None = None, *,
                 max_items: int = 256, frame_bytes: int = 64 * 1024, frame_items: int = 4096,
                 max_bytes: int = 8 * 1024 * 1024) -> None:
        self._engine = engine
        self._encoders = encoders
        self._cache = cache
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._frame_bytes = frame_bytes
        self._frame_items = frame_items
        self._entries: OrderedDict[tuple[str, int, int], SharedReading] = OrderedDict()
        self.bytes = 0
        self.reads = 0  # readings made (each one encoding of a partition change)
        self.hits = 0  # readings handed out again

    def reading(self, codec: str, partition: int, after: int, expected_state: Any) -> SharedReading | None:
        """What a visit of ``partition`` from ``after`` would send now, or None: not in memory,
        too large, or the partition left ``expected_state`` (the usual path ends the stream)."""
        engine = self._engine
        if engine.closed or engine.state(partition) != expected_state:
            return None
        high = engine.high_seqno(partition)
        if high <= after:
            return idle_reading(partition, after)
        key = (codec, partition, after)
        entry = self._entries.get(key)
        if entry is not None and entry.end == high:
            self.hits += 1
            return entry
        entry = self._read(codec, partition, after)
        if entry is None:
            return None
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old.parts)
        self._entries[key] = entry
        self.bytes += len(entry.parts)
        while self.bytes > self.max_bytes and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= len(dropped.parts)
        return entry

    def _read(self, codec: str, partition: int, after: int) -> SharedReading | None:
        engine = self._engine
        backlog = engine.memory_backlog(partition, after)
        if backlog is None or backlog > self.max_items:
            return None
        snap = engine.memory_snapshot(partition, after)
        if snap is None:
            return None
        cursor = PartitionCursor(partition, after, after, frame_bytes=self._frame_bytes,
                                 frame_items=self._frame_items)
        out: list[Marker | Batch] = []
        if not cursor.produce(lambda _p, _a: snap, self._encoders[codec], 1 << 30, out, self._cache, codec):
            cursor.close()
            return None
        steps: list[MarkerStep | BatchStep] = []
        frames: list[str | bytes] = []
        size = 0
        for x in out:
            if isinstance(x, Marker):
                steps.append(MarkerStep(x.start, x.end, x.purge_seqno))
                frames.append(x.text)
                size += len(x.text)
            else:
                steps.append(BatchStep(x.last_seqno, x.last))
                frames.append(x.data)
                size += len(x.data)
        end = max(cursor.last_seqno, snap.high_seqno)
        self.reads += 1
        return SharedReading(partition, after, end, tuple(steps), encode_parts(frames), len(frames), size)

    def __len__(self) -> int:
        return len(self._entries)
