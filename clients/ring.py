"""The rollback ring: a bounded record of recent (partition, seqno, key) the consumer applied.

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

On disk (one directory, no LMDB: clients must not import it) the ring is one append-only log:

    file   := b"UPRRING1" chunk*
    chunk  := u32 payload_len, u32 crc32(payload), payload
    payload:= record*
    record := u8 kind, u16 partition, u64 seqno, u16 key_len, key
            | u8 3 (BATCH), u16 partition, u32 n, u64 seqnos[n], u32 key_ends[n], keys blob
    kind   := 0 ENTRY | 1 DROP_ABOVE (entries of partition with seqno > seqno) | 2 FLOOR (set floor)
            | 3 BATCH (the entries of one streamed batch, columnar: written with a few C calls)

One chunk is written with a single ``os.write`` per batch *before* the batch is handed to the
handler, so a consumer killed at any point finds every key it may have applied (the page cache
survives a SIGKILL).  ``sync()`` fsyncs; the consumer calls it before it saves its state, so a saved
state never claims items the ring lost to a power cut.  A torn last chunk (crc mismatch or short) is
cut off on open.  The log is compacted (rewritten as floors + live entries, write-temp + fsync +
rename + fsync dir) whenever it grew by ``capacity // 2`` records, so the file holds at most about
1.5 × capacity records.
"""
from __future__ import annotations

import os
import struct
import sys
from array import array
import zlib
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any, NamedTuple

from .errors import StateCorrupt, UsageError
from .files import atomic_write

__all__ = ["RingEntry", "RollbackRing"]

MAGIC = b"UPRRING1"
_CHUNK = struct.Struct("<II")
_RECORD = struct.Struct("<BHQH")
_BATCH = struct.Struct("<BHI")
_BIG_ENDIAN = sys.byteorder == "big"
ENTRY, DROP_ABOVE, FLOOR, BATCH = 0, 1, 2, 3
FILE_NAME = "ring.log"


class RingEntry(NamedTuple):
    partition: int
    seqno: int
    key: bytes


class RollbackRing:
    """Bounded by entries (``capacity``); optional durable log in ``directory``."""

    def __init__(self, capacity: int = 100_000, directory: str | os.PathLike[str] | None = None) -> None:
        if capacity < 1:
            raise UsageError(f"ring capacity must be >= 1, got {capacity}", field="ring_size")
        self.capacity = capacity
        # Chunks of entries as appended, oldest first: [partition, seqnos, keys, start]; the live
        # entries of a chunk are seqnos[start:] / keys[start:], ascending seqnos.  A streamed batch is
        # one chunk, so appending and evicting cost per batch, not per item.
        self._chunks: deque[list[Any]] = deque()
        self._len = 0
        self._floors: dict[int, int] = {}
        self._path = Path(directory) / FILE_NAME if directory is not None else None
        self._fd: int | None = None
        self._records_since_compaction = 0
        self._compact_every = max(capacity // 2, 64)
        self._dirty = False
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._load()

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return self._len

    def _iter(self, partition: int | None = None) -> Iterator[RingEntry]:
        for p, seqnos, keys, start in self._chunks:
            if partition is None or p == partition:
                for i in range(start, len(seqnos)):
                    yield RingEntry(p, seqnos[i], keys[i])

    @property
    def path(self) -> Path | None:
        return self._path

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
        self._log(_RECORD.pack(FLOOR, partition, seqno, 0))

    def append(self, partition: int, seqno: int, key: bytes) -> None:
        self.append_batch(partition, (seqno,), (key,))

    def append_batch(self, partition: int, seqnos: Sequence[int], keys: Sequence[bytes]) -> None:
        """Record a batch of items about to be applied; one write for the whole batch."""
        self._add(partition, seqnos, keys)  # memory first, so a compaction triggered by _log includes it
        if self._path is not None and len(seqnos):
            self._log(_batch_record(partition, seqnos, keys), len(seqnos))

    def drop_above(self, partition: int, seqno: int) -> int:
        """Forget entries of ``partition`` above ``seqno`` (after their corrections were applied)."""
        before = self._len
        self._truncate(partition, seqno)
        self._log(_RECORD.pack(DROP_ABOVE, partition, seqno, 0))
        return before - self._len

    def replace_above(self, partition: int, seqno: int, entries: Sequence[tuple[bytes, int]] = ()) -> None:
        """``drop_above`` and re-add ``entries`` (key, seqno) in one atomic log chunk.

        Used after rollback corrections: a corrected key whose current version is above the
        rollback seqno must stay covered, since that version may be rolled back in turn."""
        self._truncate(partition, seqno)
        entries = sorted(entries, key=lambda e: e[1])
        records = [_RECORD.pack(DROP_ABOVE, partition, seqno, 0)]
        for key, s in entries:
            records.append(_RECORD.pack(ENTRY, partition, s, len(key)))
            records.append(key)
        self._add(partition, [s for _, s in entries], [k for k, _ in entries])
        self._log(b"".join(records), 1 + len(entries))

    def reset(self, partition: int) -> None:
        """The partition is streamed again from 0: nothing of it is applied any more."""
        self._truncate(partition, -1)
        self._floors[partition] = 0
        self._log(_RECORD.pack(DROP_ABOVE, partition, 0, 0) + _RECORD.pack(FLOOR, partition, 0, 0))

    def sync(self) -> None:
        """fsync the log: call before saving consumer state that relies on these entries."""
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
            self._dirty = False

    def close(self) -> None:
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RollbackRing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
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

    def _log(self, payload: bytes, records: int = 1) -> None:
        if self._fd is None:
            return
        os.write(self._fd, _CHUNK.pack(len(payload), zlib.crc32(payload)) + payload)
        self._dirty = True
        self._records_since_compaction += records
        if self._records_since_compaction >= self._compact_every:
            self.compact()

    def compact(self) -> None:
        """Rewrite the log as floors + live entries, atomically."""
        if self._path is None:
            return
        records = [_RECORD.pack(FLOOR, p, s, 0) for p, s in sorted(self._floors.items())]
        for p, seqnos, keys, start in self._chunks:
            records.append(_batch_record(p, seqnos[start:], keys[start:]))
        payload = b"".join(records)
        atomic_write(self._path, MAGIC + _CHUNK.pack(len(payload), zlib.crc32(payload)) + payload,
                     tmp=self._path.with_name(FILE_NAME + ".tmp"))
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._records_since_compaction = 0
        self._dirty = False

    def _load(self) -> None:
        assert self._path is not None
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            data = b""
        if not data:
            atomic_write(self._path, MAGIC, tmp=self._path.with_name(FILE_NAME + ".tmp"))
            good = len(MAGIC)
        else:
            if not data.startswith(MAGIC):
                raise StateCorrupt(f"{self._path} is not a rollback ring log (bad magic)")
            good = self._replay(data)
        if good < len(data):
            os.truncate(self._path, good)  # torn tail from a crash mid-write: never applied, safe to cut
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        if self._records_since_compaction >= self._compact_every:
            self.compact()

    def _replay(self, data: bytes) -> int:
        pos = len(MAGIC)
        end = len(data)
        unpack_chunk = _CHUNK.unpack_from
        unpack = _RECORD.unpack_from
        rsize = _RECORD.size
        while pos + _CHUNK.size <= end:
            length, crc = unpack_chunk(data, pos)
            body_start = pos + _CHUNK.size
            body_end = body_start + length
            if body_end > end or zlib.crc32(data[body_start:body_end]) != crc:
                break
            i = body_start
            while i < body_end:
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
                    self._records_since_compaction += n
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
                    raise StateCorrupt(f"{self._path}: unknown ring record kind {kind} at offset {i - rsize}")
                self._records_since_compaction += 1
            pos = body_end
        return pos


def _batch_record(partition: int, seqnos: Sequence[int], keys: Sequence[bytes]) -> bytes:
    """One columnar BATCH record: a few C-level calls however many entries."""
    cols = array("Q", seqnos)
    ends = array("I", accumulate(map(len, keys)))
    if _BIG_ENDIAN:  # pragma: no cover
        cols.byteswap()
        ends.byteswap()
    return b"".join((_BATCH.pack(BATCH, partition, len(cols)), cols.tobytes(), ends.tobytes(), b"".join(keys)))

