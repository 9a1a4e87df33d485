"""Segment files: one partition's changes for one run, in seqno order, in checksummed blocks.

Layout (all integers little-endian)::

    file header   16 bytes   b"UPRSEG" | u16 version | u32 partition | u32 crc32(first 12 bytes)
    block *       40 bytes   b"BLK1" | u32 stored_len | u32 raw_len | u32 records
                             | u64 first_seqno | u64 last_seqno | u32 crc32(payload) | u32 crc32(first 36 bytes)
                  payload    zlib(records) (or the raw records when that is not smaller)
    record        31 bytes   u8 kind | u64 seqno | u64 cas | u64 rev | u16 key_len | u32 value_len
                             then key, value
                  kind 0 = mutation, 1 = deletion,
                  kind 2 = snapshot marker (seqno = start, cas = end, value = source),
                  kind 3 = checkpoint: the stream position after the records before it
                           (seqno, cas = uuid, rev = snap_start, value = u64 snap_end);
                           seqno == snap_end means the snapshot is complete

Why blocks: a damaged byte is then located to one block (file + offset) and everything before it
stays readable; the block header repeats the seqno range so verify can check ordering without
decompressing, and a torn tail (crash while appending) is recognisable as such.  The file is
append-only; the run manifest records its length and sha256, so a file that is complete but
swapped or truncated at a block boundary is caught too.
"""
from __future__ import annotations

import hashlib
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from clients.backup.errors import CorruptArchive
from engine.core.errors import InvalidInput
from engine.core.types import Item
from engine.protocol.client.offset import StreamOffset

MAGIC = b"UPRSEG"
VERSION = 1
BLOCK_MAGIC = b"BLK1"

_FILE_HEADER = struct.Struct("<6sHI")  # + u32 crc
_BLOCK_HEADER = struct.Struct("<4sIIIQQI")  # + u32 crc
_RECORD = struct.Struct("<BQQQHI")
_U64 = struct.Struct("<Q")
FILE_HEADER_SIZE = _FILE_HEADER.size + 4
BLOCK_HEADER_SIZE = _BLOCK_HEADER.size + 4

KIND_MUTATION = 0
KIND_DELETION = 1
KIND_SNAPSHOT = 2
KIND_CHECKPOINT = 3

#: Upper bound on one block's raw size; a block holds at least one record even if larger.
DEFAULT_BLOCK_BYTES = 256 << 10
#: zlib level 1: most of the ratio of level 6 at several times the speed, which is what a
#: backup window cares about.
DEFAULT_LEVEL = 1
#: Refuse absurd lengths in a damaged header before allocating memory for them.
MAX_BLOCK_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class SnapshotMarker:
    """A snapshot boundary as the stream delivered it; items up to ``end`` follow."""

    start: int
    end: int
    source: str


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What the manifest records about a finished segment."""

    bytes: int
    sha256: str
    blocks: int
    mutations: int
    deletions: int
    snapshots: int
    first_seqno: int
    last_seqno: int


class SegmentWriter:
    """Append one partition's changes; ``close()`` makes them durable and returns the summary.

    Seqnos must strictly increase (the stream guarantees it; a violation here means a bug
    upstream and must not be archived silently).
    """

    def __init__(
        self,
        path: Path,
        partition: int,
        *,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        level: int = DEFAULT_LEVEL,
        background: bool = False,
    ) -> None:
        self.path = path
        self._background = background
        self._inflight: Future[None] | None = None
        self.partition = partition
        self._block_bytes = block_bytes
        self._level = level
        self._fh = open(path, "wb")
        self._sha = hashlib.sha256()
        self._size = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_count = 0
        self._pending_first = 0
        self._pending_last = 0
        self._last_seqno = 0
        self._first_seqno = 0
        self._blocks = 0
        self._mutations = 0
        self._deletions = 0
        self._snapshots = 0
        head = _FILE_HEADER.pack(MAGIC, VERSION, partition)
        self._write(head + struct.pack("<I", zlib.crc32(head)))

    # ------------------------------------------------------------------ appending
    def snapshot(self, start: int, end: int, source: str) -> None:
        """A snapshot marker.  One that replaces a marker which brought no items (a stream
        re-announced after a reconnect) overwrites it rather than leaving an empty snapshot."""
        raw = source.encode()
        if self._pending and self._pending[-1][0] == KIND_SNAPSHOT:
            dropped = self._pending.pop()
            self._pending_bytes -= len(dropped)
            self._pending_count -= 1
            self._snapshots -= 1
        self._append(_RECORD.pack(KIND_SNAPSHOT, start, end, 0, 0, len(raw)) + raw, None)
        self._snapshots += 1

    def checkpoint(self, offset: StreamOffset) -> None:
        """Record the stream position once the records before it are written: a killed run
        resumes here (a partial-snapshot position too, as DCP resumes from one)."""
        self._append(_RECORD.pack(KIND_CHECKPOINT, offset.seqno, offset.uuid, offset.snap_start, 0, 8)
                     + _U64.pack(offset.snap_end), None)

    def add(self, item: Item) -> None:
        seqno = item.seqno
        if seqno <= self._last_seqno:
            raise ValueError(
                f"partition {self.partition}: seqno {seqno} after {self._last_seqno}; segments are in seqno order"
            )
        key = item.key
        value = b"" if item.deleted else item.value
        kind = KIND_DELETION if item.deleted else KIND_MUTATION
        self._append(_RECORD.pack(kind, seqno, item.cas, item.rev, len(key), len(value)) + key + value, seqno)
        if item.deleted:
            self._deletions += 1
        else:
            self._mutations += 1

    def add_many(self, items: Iterable[Item]) -> None:
        for item in items:
            self.add(item)

    def add_columns(self, keys: Sequence[bytes], seqnos: Sequence[int], cas: Sequence[int], revs: Sequence[int],
                    deleted: Sequence[int], values: Sequence[bytes]) -> None:
        """The stream's batch columns straight in (fast path: no per-item objects)."""
        n = len(seqnos)
        if not n:
            return
        if seqnos[0] <= self._last_seqno:
            raise ValueError(
                f"partition {self.partition}: seqno {seqnos[0]} after {self._last_seqno}; segments are in seqno order"
            )
        pack = _RECORD.pack
        out = self._pending
        nbytes = 0
        ndel = 0
        prev = self._last_seqno
        for key, seqno, c, rev, d, value in zip(keys, seqnos, cas, revs, deleted, values):
            if seqno <= prev:
                raise ValueError(f"partition {self.partition}: seqno {seqno} after {prev}; segments are in seqno order")
            prev = seqno
            if d:
                ndel += 1
                rec = pack(KIND_DELETION, seqno, c, rev, len(key), 0) + key
            else:
                rec = pack(KIND_MUTATION, seqno, c, rev, len(key), len(value)) + key + value
            out.append(rec)
            nbytes += len(rec)
        if not self._pending_first:
            self._pending_first = seqnos[0]
        if not self._first_seqno:
            self._first_seqno = seqnos[0]
        self._pending_last = self._last_seqno = seqnos[-1]
        self._pending_bytes += nbytes
        self._pending_count += n
        self._deletions += ndel
        self._mutations += n - ndel
        if self._pending_bytes >= self._block_bytes:
            self.flush_block()

    def _append(self, record: bytes, seqno: int | None) -> None:
        if seqno is not None:
            if not self._pending_first:
                self._pending_first = seqno
            self._pending_last = seqno
            if not self._first_seqno:
                self._first_seqno = seqno
            self._last_seqno = seqno
        self._pending.append(record)
        self._pending_bytes += len(record)
        self._pending_count += 1
        if self._pending_bytes >= self._block_bytes:
            self.flush_block()

    def flush_block(self) -> None:
        """Seal the pending records into one block (called on size, and at close).

        With ``background=True`` the compression runs on a worker thread (zlib releases the GIL)
        while the caller goes on receiving; at most one block per writer is in flight, and blocks
        reach the file in order."""
        if not self._pending:
            return
        raw = b"".join(self._pending)
        args = (raw, self._level, self._pending_count, self._pending_first, self._pending_last)
        self._pending = []
        self._pending_bytes = self._pending_count = self._pending_first = self._pending_last = 0
        self._blocks += 1
        if self._inflight is not None:
            self._inflight.result()
            self._inflight = None
        if self._background:
            self._inflight = _pool().submit(self._seal_and_write, *args)
        else:
            self._seal_and_write(*args)

    def _seal_and_write(self, raw: bytes, level: int, count: int, first: int, last: int) -> None:
        self._write(_seal_block(raw, level, count, first, last))

    def _write(self, data: bytes) -> None:
        self._fh.write(data)
        self._sha.update(data)
        self._size += len(data)

    # ------------------------------------------------------------------ finishing
    def close(self, *, sync: bool = True) -> SegmentSummary:
        """Seal the last block; ``sync=False`` leaves the fsync to the caller (batched at commit)."""
        self.flush_block()
        if self._inflight is not None:
            self._inflight.result()
            self._inflight = None
        self._fh.flush()
        if sync:
            os.fsync(self._fh.fileno())
        self._fh.close()
        return SegmentSummary(
            bytes=self._size, sha256=self._sha.hexdigest(), blocks=self._blocks,
            mutations=self._mutations, deletions=self._deletions, snapshots=self._snapshots,
            first_seqno=self._first_seqno, last_seqno=self._last_seqno,
        )

    def abort(self) -> None:
        """Drop the file (used when a partition must be retaken from another point)."""
        if self._inflight is not None:
            try:
                self._inflight.result()
            except Exception:  # noqa: BLE001 - the file is deleted anyway
                pass
            self._inflight = None
        self._fh.close()
        self.path.unlink(missing_ok=True)

    @property
    def last_seqno(self) -> int:
        return self._last_seqno


def _seal_block(raw: bytes, level: int, count: int, first: int, last: int) -> bytes:
    packed = zlib.compress(raw, level) if level else raw  # level 0: store, no zlib pass
    stored = packed if len(packed) < len(raw) else raw
    head = _BLOCK_HEADER.pack(BLOCK_MAGIC, len(stored), len(raw), count, first, last, zlib.crc32(stored))
    return head + struct.pack("<I", zlib.crc32(head)) + stored


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="upr-backup-zlib")
        return _POOL


@dataclass(frozen=True, slots=True)
class BlockInfo:
    offset: int
    stored_len: int
    raw_len: int
    records: int
    first_seqno: int
    last_seqno: int


class SegmentReader:
    """Validate and decode a segment; every failure is a ``CorruptArchive`` naming file and offset."""

    def __init__(self, path: Path, *, partition: int | None = None, display: str | None = None) -> None:
        self.path = path
        self.partition = partition
        self.display = display or str(path)

    def _corrupt(self, message: str, offset: int, seqno: int | None = None) -> CorruptArchive:
        return CorruptArchive(message, path=self.display, offset=offset, partition=self.partition, seqno=seqno)

    def blocks(self, sha: "hashlib._Hash | None" = None) -> Iterator[tuple[BlockInfo, bytes]]:
        """Yield each block's header and decompressed payload, checking every CRC."""
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            raise CorruptArchive("segment file is missing", path=self.display, partition=self.partition) from None
        with fh:
            head = fh.read(FILE_HEADER_SIZE)
            if sha is not None:
                sha.update(head)
            if len(head) < FILE_HEADER_SIZE:
                raise self._corrupt("truncated file header", 0)
            magic, version, part = _FILE_HEADER.unpack_from(head)
            (crc,) = struct.unpack_from("<I", head, _FILE_HEADER.size)
            if magic != MAGIC or crc != zlib.crc32(head[: _FILE_HEADER.size]):
                raise self._corrupt("bad file header (magic or checksum)", 0)
            if version != VERSION:
                raise self._corrupt(f"unsupported segment version {version}", 0)
            if self.partition is not None and part != self.partition:
                raise self._corrupt(f"segment belongs to partition {part}, expected {self.partition}", 0)
            offset = FILE_HEADER_SIZE
            while True:
                bhead = fh.read(BLOCK_HEADER_SIZE)
                if not bhead:
                    return
                if sha is not None:
                    sha.update(bhead)
                if len(bhead) < BLOCK_HEADER_SIZE:
                    raise self._corrupt(f"truncated block header ({len(bhead)} of {BLOCK_HEADER_SIZE} bytes)", offset)
                fields = _BLOCK_HEADER.unpack_from(bhead)
                (hcrc,) = struct.unpack_from("<I", bhead, _BLOCK_HEADER.size)
                if fields[0] != BLOCK_MAGIC or hcrc != zlib.crc32(bhead[: _BLOCK_HEADER.size]):
                    raise self._corrupt("bad block header (magic or checksum)", offset)
                _, stored_len, raw_len, records, first, last, pcrc = fields
                if stored_len > MAX_BLOCK_BYTES or raw_len > MAX_BLOCK_BYTES:
                    raise self._corrupt("block length out of range", offset)
                stored = fh.read(stored_len)
                if sha is not None:
                    sha.update(stored)
                if len(stored) < stored_len:
                    raise self._corrupt(
                        f"truncated block payload ({len(stored)} of {stored_len} bytes)", offset, first or None
                    )
                if zlib.crc32(stored) != pcrc:
                    raise self._corrupt(
                        f"block payload checksum mismatch (seqnos {first}..{last})", offset, first or None
                    )
                if stored_len == raw_len:
                    raw = stored
                else:
                    try:
                        raw = zlib.decompress(stored)
                    except zlib.error as exc:
                        raise self._corrupt(f"block does not decompress: {exc}", offset, first or None) from None
                if len(raw) != raw_len:
                    raise self._corrupt("block raw length mismatch", offset, first or None)
                yield BlockInfo(offset, stored_len, raw_len, records, first, last), raw
                offset += BLOCK_HEADER_SIZE + stored_len

    def records(self, sha: "hashlib._Hash | None" = None) -> Iterator[Item | SnapshotMarker | StreamOffset]:
        """Every record in file order: ``Item`` for changes, ``SnapshotMarker`` for snapshot
        starts and ``StreamOffset`` for checkpoints (the stream position after the records before)."""
        unpack = _RECORD.unpack_from
        size = _RECORD.size
        for info, raw in self.blocks(sha):
            pos = 0
            count = 0
            end = len(raw)
            while pos < end:
                if pos + size > end:
                    raise self._corrupt("record header crosses block end", info.offset)
                kind, seqno, cas, rev, klen, vlen = unpack(raw, pos)
                pos += size
                key = raw[pos : pos + klen]
                pos += klen
                value = raw[pos : pos + vlen]
                pos += vlen
                if pos > end:
                    raise self._corrupt("record body crosses block end", info.offset, seqno)
                count += 1
                if kind == KIND_MUTATION:
                    yield Item(key, seqno, cas, rev, False, value)
                elif kind == KIND_DELETION:
                    yield Item(key, seqno, cas, rev, True, b"")
                elif kind == KIND_SNAPSHOT:
                    yield SnapshotMarker(seqno, cas, value.decode("ascii", "replace"))
                elif kind == KIND_CHECKPOINT:
                    if vlen != 8:
                        raise self._corrupt("checkpoint record of the wrong size", info.offset, seqno)
                    try:
                        yield StreamOffset(cas, seqno, rev, _U64.unpack(value)[0])
                    except InvalidInput as exc:
                        raise self._corrupt(f"checkpoint record is not a position: {exc}", info.offset, seqno) from None
                else:
                    raise self._corrupt(f"unknown record kind {kind}", info.offset, seqno)
            if count != info.records:
                raise self._corrupt(f"block says {info.records} records, holds {count}", info.offset)

    def items(self) -> Iterator[Item]:
        for rec in self.records():
            if isinstance(rec, Item):
                yield rec

    def salvage(self) -> Iterator[Item | SnapshotMarker | StreamOffset]:
        """The records of an unfinished file up to its first damage (a torn tail after a kill),
        without raising: what a resumed run can still use."""
        try:
            yield from self.records()
        except CorruptArchive:
            return
