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

Readings are offered only when they are small: at most ``max_items`` seqnos.  When the write
queue's memory alone no longer covers the position (the flusher persisted past it: a consumer
more than a flush interval behind), ``read`` takes the reading through the engine's full snapshot
on a reader thread, once for all connections asking at that position and high seqno, and keeps
it like the others (at most ``disk_budget`` bytes encoded).  A position further behind gets None
and its connection reads for itself (reader-thread jobs, which share encoded parts through the
``TailCache``); the readings made here are stored in that cache too, so such a connection catches
up on them.

Bounded by ``max_bytes`` of encoded parts (oldest entries dropped first).  The table is the event
loop's; only ``_read_disk`` / ``_encode`` run on reader threads, and they touch none of it.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from app.stream.cursor import Batch, BatchEncoder, Marker, PartitionCursor, marker_text
from app.stream.tailcache import CachedSnapshot, TailCache
from engine.protocol.bundle import encode_parts
from engine.protocol.message_types import SnapshotSource
from engine.protocol.shared_pass import BatchStep, MarkerStep, SharedReading, idle_reading

__all__ = ["SharedReadings"]

_MEMORY = SnapshotSource.MEMORY


class SharedReadings:
    def __init__(self, engine: Any, encoders: dict[str, BatchEncoder], cache: TailCache | None = None, *,
                 max_items: int = 256, frame_bytes: int = 64 * 1024, frame_items: int = 4096,
                 max_bytes: int = 8 * 1024 * 1024, disk_budget: int = 48 * 1024) -> None:
        self._engine = engine
        self._encoders = encoders
        self._cache = cache
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._frame_bytes = frame_bytes
        self._frame_items = frame_items
        self._entries: OrderedDict[tuple[str, int, int], SharedReading] = OrderedDict()
        self.bytes = 0
        #: a disk reading larger than this (encoded) is not shared: the connection reads for itself
        self._disk_budget = disk_budget
        #: disk readings being taken, by (key, high seqno): connections asking meanwhile wait for it
        self._pending: dict[tuple[tuple[str, int, int], int], asyncio.Future[SharedReading | None]] = {}
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
        self._store(key, entry)
        return entry

    def readings(self, codec: str, partitions: Sequence[int], streams: Mapping[int, Any]) -> list[SharedReading] | None:
        """``reading`` for each of ``partitions`` at its stream's position (``streams``: the
        session's), in one call; None as soon as one has none (the pass goes the usual way).

        WHY one call: a hub delivery of a bulk write touches most partitions, and a tailing
        connection's pass asks for all of them at once; the first connection at those positions
        reads and encodes every partition here, in one loop, and every other connection at the
        same positions gets the same readings back (``ServerSession.take_readings`` then
        advances its session over them in one call)."""
        engine = self._engine
        if engine.closed:
            return None
        entries = self._entries
        state_of, high_of = engine.state, engine.high_seqno
        out: list[SharedReading] = []
        for p in partitions:
            stream = streams[p]
            after = stream.position
            if state_of(p) != stream.expected_state:
                return None
            high = high_of(p)
            if high <= after:
                out.append(idle_reading(p, after))
                continue
            key = (codec, p, after)
            entry = entries.get(key)
            if entry is None or entry.end != high:
                entry = self._read(codec, p, after)
                if entry is None:
                    return None
                self._store(key, entry)
            else:
                self.hits += 1
            out.append(entry)
        return out

    def _store(self, key: tuple[str, int, int], entry: SharedReading) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old.parts)
        self._entries[key] = entry
        self.bytes += len(entry.parts)
        while self.bytes > self.max_bytes and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= len(dropped.parts)

    def current(self, reading: SharedReading, expected_state: Any) -> bool:
        """Whether ``reading`` is still what a visit from its position would send now."""
        engine = self._engine
        return (not engine.closed and engine.state(reading.partition) == expected_state
                and engine.high_seqno(reading.partition) == reading.end)

    def may_read(self, partition: int, after: int) -> bool:
        """Whether a reading from disk (``read``) is worth taking: a short backlog that the write
        queue's memory no longer covers alone (the flusher persisted past the position)."""
        return 0 < self._engine.high_seqno(partition) - after <= self.max_items

    async def read(self, codec: str, partition: int, after: int, expected_state: Any,
                   run: Callable[..., Awaitable[Any]]) -> SharedReading | None:
        """``reading`` for a position only a disk reading covers: taken on a reader thread
        (``run``, e.g. ``EngineRunner.read``) once for every connection that asks at the same
        position and high seqno meanwhile, then kept like the memory readings.  WHY: a consumer
        a few milliseconds behind (more than a flush interval) otherwise leaves the shared path
        at once, and under load its own per-visit production puts it further behind."""
        return await self.await_read(self.begin_read(codec, partition, after, expected_state, run))

    def begin_read(self, codec: str, partition: int, after: int, expected_state: Any,
                   run: Callable[..., Awaitable[Any]]) -> "SharedReading | asyncio.Future[SharedReading | None]":
        """``read`` in two steps: the reading if it is already taken, else the future of the one
        being taken (started here if nobody asked yet); ``await_read`` waits for it.  WHY apart:
        a pass needing several readings starts them all before waiting for any, without a task
        per reading (``asyncio.gather`` made one each, the larger part of a pass's loop time when
        many connections wait for the same readings, profiled)."""
        key = (codec, partition, after)
        high = self._engine.high_seqno(partition)
        entry = self._entries.get(key)
        if entry is not None and entry.end == high:
            self.hits += 1
            return entry
        pending = self._pending.get((key, high))
        if pending is None:
            pending = asyncio.ensure_future(run(self._read_disk, codec, partition, after, expected_state))
            self._pending[(key, high)] = pending
            pending.add_done_callback(lambda fut: self._read_done(key, high, fut))
        else:
            self.hits += 1
        return pending

    @staticmethod
    async def await_read(started: "SharedReading | asyncio.Future[SharedReading | None]") -> SharedReading | None:
        """The result of ``begin_read``: None if the reading failed (the usual path reports it)."""
        if isinstance(started, SharedReading):
            return started
        try:
            return await asyncio.shield(started)
        except Exception:  # noqa: BLE001 - the engine closing, the state changing: the usual path reports it
            return None

    def _read_done(self, key: tuple[str, int, int], high: int, fut: "asyncio.Future[SharedReading | None]") -> None:
        self._pending.pop((key, high), None)
        if fut.cancelled() or fut.exception() is not None or fut.result() is None:
            return
        self._store(key, fut.result())  # type: ignore[arg-type]

    def _read_disk(self, codec: str, partition: int, after: int, expected_state: Any) -> SharedReading | None:
        """Reader thread: the reading of ``partition`` after ``after`` through the engine's full
        snapshot (disk and memory); None when it is larger than one bundle."""
        engine = self._engine
        if engine.state(partition) != expected_state:
            return None
        snap = engine.snapshot(partition, after)
        return self._encode(codec, partition, after, snap, self._disk_budget)

    def _read(self, codec: str, partition: int, after: int) -> SharedReading | None:
        engine = self._engine
        frame = engine.memory_frame(partition, after, self.max_items, self._frame_items, self._frame_bytes)
        if frame is not None:
            return self._one_frame(codec, partition, after, *frame)
        backlog = engine.memory_backlog(partition, after)
        if backlog is None or backlog > self.max_items:
            return None
        snap = engine.memory_snapshot(partition, after)
        if snap is None:
            return None
        small = self._encode_one_batch(codec, partition, after, snap)
        if small is not None:
            return small
        return self._encode(codec, partition, after, snap, 1 << 30)

    def _one_frame(self, codec: str, partition: int, after: int, high: int, purge_seqno: int,
                   cols: Any) -> SharedReading:
        """The reading of a memory snapshot after ``after`` whose items ``cols`` (up to ``high``)
        are one batch (``Engine.memory_frame``): its marker and its one ``last`` batch, and the
        same ``TailCache`` entry ``_encode_one_batch`` (and the cursor) make.  WHY: the tail's
        common reading, made for every partition a write touched, without a snapshot object
        (see ``_encode_one_batch``)."""
        data = self._encoders[codec](partition, cols, True)
        last_seqno = cols.seqnos[-1]
        start = after + 1
        text = marker_text(partition, start, high, _MEMORY, purge_seqno)
        if self._cache is not None:
            marker = Marker(partition, start, high, _MEMORY, purge_seqno, text)
            self._cache.put(codec, partition, CachedSnapshot(after, high, (marker, Batch(data, last_seqno, True)),
                                                             len(data)))
        self.reads += 1
        reading = SharedReading.one_batch(partition, after, high, (start, high, purge_seqno), last_seqno,
                                          encode_parts([text, data]), len(text) + len(data))
        if type(data) is bytes:
            reading.messages = (("marker", partition, start, high, _MEMORY, purge_seqno), ("batch", partition, data))
        return reading

    def _encode_one_batch(self, codec: str, partition: int, after: int, snap: Any) -> SharedReading | None:
        """``_encode`` of the common tail reading, a fresh memory snapshot whose items fit one
        frame: its marker and its one ``last`` batch, formatted here without a cursor; None for
        anything else (several parts or frames, no items), which ``_encode`` then takes.

        WHY: a tailing consumer's pass visits every partition a bulk request touched, a few items
        each, and the cursor's general reading (plan, iterators, deques, release) cost more per
        visit than encoding the items (``bench.bench_tail_pass``).  The output is the cursor's,
        part for part: same marker, same batch cut (``SnapshotPart.columns``), same cache entry."""
        if len(snap.parts) != 1:
            return None
        part = snap.parts[0]
        frames = part.columns(self._frame_items, self._frame_bytes)
        try:
            cols = next(frames, None)
            if cols is None or not len(cols) or next(frames, None) is not None:
                return None
        finally:
            close = getattr(frames, "close", None)
            if close is not None:
                close()
        data = self._encoders[codec](partition, cols, True)
        last_seqno = cols.seqnos[-1]
        marker = Marker(partition, part.start, part.end, part.source, snap.purge_seqno)
        snap.close()
        if self._cache is not None:
            self._cache.put(codec, partition,
                            CachedSnapshot(part.start - 1, part.end, (marker, Batch(data, last_seqno, True)), len(data)))
        self.reads += 1
        reading = SharedReading.one_batch(partition, after, max(last_seqno, part.end, snap.high_seqno),
                                          (part.start, part.end, snap.purge_seqno), last_seqno,
                                          encode_parts([marker.text, data]), len(marker.text) + len(data))
        if type(data) is bytes:
            reading.messages = (("marker", partition, part.start, part.end, part.source, snap.purge_seqno),
                                ("batch", partition, data))
        return reading

    def _encode(self, codec: str, partition: int, after: int, snap: Any, budget: int) -> SharedReading | None:
        """Any thread: ``snap`` encoded as a visit from ``after`` encodes it (the cache is thread-safe)."""
        cursor = PartitionCursor(partition, after, after, frame_bytes=self._frame_bytes,
                                 frame_items=self._frame_items)
        out: list[Marker | Batch] = []
        if not cursor.produce(lambda _p, _a: snap, self._encoders[codec], budget, out, self._cache, codec):
            cursor.close()
            return None
        steps: list[MarkerStep | BatchStep] = []
        frames: list[str | bytes] = []
        messages: list[tuple[Any, ...]] | None = []
        size = 0
        for x in out:
            if isinstance(x, Marker):
                steps.append(MarkerStep(x.start, x.end, x.purge_seqno))
                frames.append(x.text)
                size += len(x.text)
                if messages is not None:
                    messages.append(("marker", partition, x.start, x.end, x.source, x.purge_seqno))
            else:
                steps.append(BatchStep(x.last_seqno, x.last))
                frames.append(x.data)
                size += len(x.data)
                if messages is not None:
                    if type(x.data) is bytes:
                        messages.append(("batch", partition, x.data))
                    else:
                        messages = None  # JSON batches are never packed
        if size > budget:
            return None  # one batch may overshoot the budget: a reading never does
        end = max(cursor.last_seqno, snap.high_seqno)
        self.reads += 1
        reading = SharedReading(partition, after, end, tuple(steps), encode_parts(frames), len(frames), size)
        if messages is not None:
            reading.messages = tuple(messages)
        return reading

    def __len__(self) -> int:
        return len(self._entries)
