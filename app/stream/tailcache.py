"""Encoded snapshot parts shared by every connection tailing a partition.

Theory of operation
-------------------
Fifty consumers tailing the same partitions would otherwise read and encode the same new items
fifty times.  When a visit's snapshot part is encoded whole (marker through ``last`` batch, not a
continuation), the cursor stores it here under ``(codec, partition, after)`` where
``after = part.start - 1``: the position a consumer must hold for that part to be exactly a
snapshot it could have got itself (a disk or memory part is a deduplicated, self-contained DCP
snapshot of its range, taken after the position).

Disk parts count as much as memory parts: the flusher persists every few milliseconds, so a
consumer more than a flush interval behind gets a disk part (persisted range) and a memory part.
When only memory parts were shared, fifty consumers each read and encoded the same disk range
(over half of the server's CPU under fan-out, profiled), and their positions then drifted apart so that the
memory entries stopped matching as well.  With both, consumers that start at the same position
stay on one chain of entries: each replays what the first one read and continues from its end.  A cursor at position ``after`` replays the stored marker and frames instead of
reading and encoding, then continues after ``end`` with a fresh reading.

Barrier cookies stay exact: a replayed entry only saves encoding of an older range; the visit's
own reading (the high seqno check, or a fresh snapshot after the replayed entries) is still taken
after the visit began.

Bounded: at most ``max_entries`` per partition and ``max_bytes`` overall; the oldest entries go
first.  ``max_bytes`` is the binding limit (32 MiB is seconds of history at 20k small writes/s): a
consumer that lags the chain by more falls off it and reads for itself.  Reader threads share it under one lock (held for dict operations only).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

__all__ = ["CachedSnapshot", "TailCache"]


@dataclass(frozen=True, slots=True)
class CachedSnapshot:
    after: int
    end: int
    outputs: tuple[Any, ...]  # the Marker then its Batches, as the cursor produced them
    size: int


class TailCache:
    def __init__(self, max_bytes: int = 32 * 1024 * 1024, max_entries: int = 1024) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int, int], CachedSnapshot] = OrderedDict()
        self._per_partition: dict[tuple[str, int], int] = {}
        self.bytes = 0
        self.hits = 0
        self.stores = 0

    def get(self, codec: str, partition: int, after: int) -> CachedSnapshot | None:
        with self._lock:
            entry = self._entries.get((codec, partition, after))
            if entry is not None:
                self.hits += 1
            return entry

    def put(self, codec: str, partition: int, entry: CachedSnapshot) -> None:
        if entry.size > self.max_bytes // 4:
            return  # a big catch-up snapshot is not a tail: not worth pinning
        key = (codec, partition, entry.after)
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = entry
            self.bytes += entry.size
            self.stores += 1
            count = self._per_partition.get((codec, partition), 0) + 1
            self._per_partition[(codec, partition)] = count
            while self.bytes > self.max_bytes or count > self.max_entries:
                old_key, old = self._entries.popitem(last=False)
                self.bytes -= old.size
                pk = (old_key[0], old_key[1])
                self._per_partition[pk] -= 1
                if pk == (codec, partition):
                    count -= 1

    def __len__(self) -> int:
        return len(self._entries)
