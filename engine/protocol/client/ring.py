"""The rollback ring model: a bounded record of recent (partition, seqno, key) the consumer applied.

Why it exists: when the server's history branches (it crashed with mutations it had streamed but not
persisted), it tells the consumer "roll back to R".  A downstream index cannot undo mutations by itself
(sync_gateway#1963: no reverse map from seqno to keys), so the ring remembers which keys the consumer
touched above R; the consumer re-reads those keys' current documents and hands them over as
corrections.  If R is below what the ring still covers, the partition must be streamed again from 0.

Coverage: for each partition the ring keeps a *floor*: every item of that partition the consumer
applied with seqno > floor is in the ring.  Eviction of the oldest entry raises the floor to the
evicted seqno.  ``covers(p, R)`` is ``R >= floor(p)``.  A partition the ring has never heard of is
not covered at all (``floor`` is None) until the consumer declares where it starts
(``set_floor``): 0 for a consumer that starts from the beginning or from "now" (it applied nothing
before), the resume seqno when the ring file was lost but the state survived.

This module does no I/O, so the client protocol session can update the ring.  Its durable form is
a log of *records* kept by ``clients.ring``: with ``journal=True`` every update also queues its
records (``take_journal``), in order, for the log to write; ``apply`` replays records read back.

    payload:= record*
    record := u8 kind, u16 partition, u64 seqno, u16 key_len, key
            | u8 3 (BATCH), u16 partition, u32 n, u64 seqnos[n], u32 key_ends[n], keys blob
    kind   := 0 ENTRY | 1 DROP_ABOVE (entries of partition with seqno > seqno) | 2 FLOOR (set floor)
            | 3 BATCH (the entries of one streamed batch, columnar: encoded with a few C calls)
"""
from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any, NamedTuple

from .errors import StateCorrupt, UsageError

__all__ = ["RingEntry", "RingModel", "batch_record", "ENTRY", "DROP_ABOVE", "FLOOR", "BATCH"]

_RECORD = struct.Struct("<BHQH")
_BATCH = struct.Struct("<BHI")
_BIG_ENDIAN = sys.byteorder == "big"
ENTRY, DROP_ABOVE, FLOOR, BATCH = 0, 1, 2, 3


class RingEntry(NamedTuple):
    partition: int
    seqno: int
    key: bytes


class RingModel:
    """Bounded by entries (``capacity``); see the module docstring."""

    def __init__(self, capacity: int = 100_000, *, journal: bool = False) -> None:
        if capacity < 1:
            raise UsageError(f"ring capacity must be >= 1, got {capacity}", field="ring_size")
        self.capacity = capacity
        # Chunks of entries as appended, oldest first: [partition, seqnos, keys, start]; the live
        # entries of a chunk are seqnos[start:] / keys[start:], ascending seqnos.  A streamed batch is
        # one chunk, so appending and evicting cost per batch, not per item.
        self._chunks: deque[list[Any]] = deque()
        self._len = 0
        self._floors: dict[int, int] = {}
        self._journal: list[tuple[bytes, int]] | None = [] if journal else None

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return self._len

    def _iter(self, partition: int | None = None) -> Iterator[RingEntry]:
        for p, seqnos, keys, start in self._chunks:
            if partition is None or p == partition:
                for i in range(start, len(seqnos)):
                    yield RingEntry(p, seqnos[i], keys[i])

    def floor(self, partition: int) -> int | None:
        """Every applied item of ``partition`` above this seqno is in the ring; None = unknown partition."""
        return self._floors.get(partition)

    def covers(self, partition: int, seqno: int) -> bool:
        floor = self._floors.get(partition)
        return floor is not None and seqno >= floor

    def oldest_seqno(self, partition: int) -> int | None:
        """Smallest seqno of ``partition`` still held, or None when it holds none."""
        seqnos = [e.seqno for e in self._iter(partition)]
        return min(seqnos) if seqnos else None

    def entries(self, partition: int | None = None) -> list[RingEntry]:
        return list(self._iter(partition))

    def entries_above(self, partition: int, seqno: int) -> list[RingEntry]:
        return [e for e in self._iter(partition) if e.seqno > seqno]

    def keys_above(self, partition: int, seqno: int) -> list[bytes]:
        """Distinct keys of ``partition`` applied above ``seqno``, in the order first applied."""
        return list(dict.fromkeys(e.key for e in self._iter(partition) if e.seqno > seqno))

    def keys_above_many(self, positions: dict[int, int]) -> dict[int, list[bytes]]:
        """``keys_above`` for many partitions in one pass (cheap: chunks below are skipped whole)."""
        found: dict[int, dict[bytes, None]] = {}
        for p, seqnos, keys, start in self._chunks:
            at = positions.get(p)
            if at is None or seqnos[-1] <= at:
                continue
            i = bisect_right(seqnos, at, start)
            found.setdefault(p, {}).update(dict.fromkeys(keys[i:]))
        return {p: list(keys) for p, keys in found.items()}

    # ------------------------------------------------------------------ updates
    def set_floor(self, partition: int, seqno: int) -> None:
        self._floors[partition] = seqno
        self._record(_RECORD.pack(FLOOR, partition, seqno, 0))

    def append(self, partition: int, seqno: int, key: bytes) -> None:
        self.append_batch(partition, (seqno,), (key,))

    def append_batch(self, partition: int, seqnos: Sequence[int], keys: Sequence[bytes]) -> None:
        """Record a batch of items about to be applied (one journal record for the whole batch)."""
        self._add(partition, seqnos, keys)
        if self._journal is not None and len(seqnos):
            self._journal.append((batch_record(partition, seqnos, keys), len(seqnos)))

    def drop_above(self, partition: int, seqno: int) -> int:
        """Forget entries of ``partition`` above ``seqno`` (after their corrections were applied)."""
        before = self._len
        self._truncate(partition, seqno)
        self._record(_RECORD.pack(DROP_ABOVE, partition, seqno, 0))
        return before - self._len

    def replace_above(self, partition: int, seqno: int, entries: Sequence[tuple[bytes, int]] = ()) -> None:
        """``drop_above`` and re-add ``entries`` (key, seqno) as one journal chunk (atomic in the log).

        Used after rollback corrections: a corrected key whose current version is above the
        rollback seqno must stay covered, since that version may be rolled back in turn."""
        self._truncate(partition, seqno)
        entries = sorted(entries, key=lambda e: e[1])
        self._add(partition, [s for _, s in entries], [k for k, _ in entries])
        if self._journal is not None:
            records = [_RECORD.pack(DROP_ABOVE, partition, seqno, 0)]
            for key, s in entries:
                records.append(_RECORD.pack(ENTRY, partition, s, len(key)))
                records.append(key)
            self._journal.append((b"".join(records), 1 + len(entries)))

    def reset(self, partition: int) -> None:
        """The partition is streamed again from 0: nothing of it is applied any more."""
        self._truncate(partition, -1)
        self._floors[partition] = 0
        self._record(_RECORD.pack(DROP_ABOVE, partition, 0, 0) + _RECORD.pack(FLOOR, partition, 0, 0), 1)

    # ------------------------------------------------------------------ the journal
    @property
    def journaling(self) -> bool:
        return self._journal is not None

    def take_journal(self) -> list[tuple[bytes, int]]:
        """The (payload, record count) chunks queued since the last call, oldest first."""
        if not self._journal:
            return []
        out, self._journal = self._journal, []
        return out

    def snapshot_payload(self) -> bytes:
        """Floors and live entries as one payload: what a compacted log holds."""
        records = [_RECORD.pack(FLOOR, p, s, 0) for p, s in sorted(self._floors.items())]
        for p, seqnos, keys, start in self._chunks:
            records.append(batch_record(p, seqnos[start:], keys[start:]))
        return b"".join(records)

    def apply(self, data: bytes, start: int = 0, end: int | None = None, *, where: str = "ring") -> int:
        """Replay the records of ``data[start:end]`` (read back from the log); returns how many."""
        end = len(data) if end is None else end
        unpack = _RECORD.unpack_from
        rsize = _RECORD.size
        count = 0
        i = start
        while i < end:
            if data[i] == BATCH:
                _, partition, n = _BATCH.unpack_from(data, i)
                i += _BATCH.size
                seqnos = array("Q")
                seqnos.frombytes(data[i:i + 8 * n])
                ends = array("I")
                ends.frombytes(data[i + 8 * n:i + 12 * n])
                if _BIG_ENDIAN:  # pragma: no cover
                    seqnos.byteswap()
                    ends.byteswap()
                i += 12 * n
                starts = [0]
                starts += ends[:-1]
                self._add(partition, seqnos, [data[i + a:i + b] for a, b in zip(starts, ends)])
                i += ends[-1] if n else 0
                count += n
                continue
            kind, partition, seqno, klen = unpack(data, i)
            i += rsize
            if kind == ENTRY:
                self._add(partition, (seqno,), (data[i:i + klen],))
                i += klen
            elif kind == DROP_ABOVE:
                self._truncate(partition, seqno)
            elif kind == FLOOR:
                self._floors[partition] = seqno
            else:
                raise StateCorrupt(f"{where}: unknown ring record kind {kind} at offset {i - rsize}")
            count += 1
        return count

    # ------------------------------------------------------------------ internals
    def _record(self, payload: bytes, records: int = 1) -> None:
        if self._journal is not None:
            self._journal.append((payload, records))

    def _add(self, partition: int, seqnos: Sequence[int], keys: Sequence[bytes]) -> None:
        n = len(seqnos)
        if not n:
            return
        floors = self._floors
        if partition not in floors:
            # Nobody declared a floor: items applied before these are unknown, and they all have
            # smaller seqnos, so the ring covers from just below the first one.
            floors[partition] = max(seqnos[0] - 1, 0)
        # copies (C-level) so that a caller mutating its batch cannot change the ring
        self._chunks.append([partition, array("Q", seqnos), list(keys), 0])
        self._len += n
        over = self._len - self.capacity
        chunks = self._chunks
        while over > 0:
            chunk = chunks[0]
            p, cseqnos, _, start = chunk
            live = len(cseqnos) - start
            if live <= over:
                chunks.popleft()
                evicted = cseqnos[-1]
                over -= live
                self._len -= live
            else:
                chunk[3] = start + over
                evicted = cseqnos[start + over - 1]
                self._len -= over
                over = 0
            if evicted > floors.get(p, 0):
                floors[p] = evicted

    def _truncate(self, partition: int, seqno: int) -> None:
        """Drop entries of ``partition`` with seqno > ``seqno`` (all of them for -1)."""
        kept: deque[list[Any]] = deque()
        for chunk in self._chunks:
            p, seqnos, keys, start = chunk
            if p != partition or seqnos[-1] <= seqno:
                kept.append(chunk)
                continue
            cut = bisect_right(seqnos, seqno, start)
            self._len -= len(seqnos) - cut
            if cut > start:
                kept.append([p, seqnos[:cut], keys[:cut], start])
        self._chunks = kept


def batch_record(partition: int, seqnos: Sequence[int], keys: Sequence[bytes]) -> bytes:
    """One columnar BATCH record: a few C-level calls however many entries."""
    cols = array("Q", seqnos)
    ends = array("I", accumulate(map(len, keys)))
    if _BIG_ENDIAN:  # pragma: no cover
        cols.byteswap()
        ends.byteswap()
    return b"".join((_BATCH.pack(BATCH, partition, len(cols)), cols.tobytes(), ends.tobytes(), b"".join(keys)))
