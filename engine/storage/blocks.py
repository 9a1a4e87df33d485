"""The block format of the by-seqno tree: one record holds a run of consecutive persisted items.

A **block** holds the items one flush wrote for the partition (at most ``BLOCK_ITEMS`` items and
about ``BLOCK_VALUE_BYTES`` of values), laid out as columns, little-endian::

    n u32, keys-blob bytes u32, values-blob bytes u64,
    seqnos u64[n], cas u64[n], revs u64[n], value ends u64[n] (offsets in the block), deleted u8[n],
    keys blob (keys joined by 0xFF, a byte UTF-8 never contains), values blob

Its by-seqno key is the first seqno (``records.SEQNO``).

WHY blocks: a by-seqno scan feeds the stream's column encoder, and with one LMDB record per
item the scan paid per item for the cursor step, two copies, a key slice and a metadata
unpack (``bench.bench_engine``, scan section, measures the walk).  A block's numeric columns
load with one ``array.frombytes`` each (a memcpy), its keys with one ``bytes.split``, so the
per-item work left is one slice per value.  The flusher gains too: one ``put`` per block
instead of a tuple, a concatenation and a B-tree insert per item.
"""
from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, compress

import lmdb

from engine.storage.errors import CorruptStore
from engine.storage.records import SEQNO

#: Most items one block holds (a flush writes bigger runs as several blocks; compaction merges
#: small blocks up to this size).
BLOCK_ITEMS = 1024
#: A block closes once its values would pass this many bytes (one bigger value travels alone).
BLOCK_VALUE_BYTES = 64 << 10
KEY_SEP = b"\xff"
BLOCK_HEADER = struct.Struct("<IIQ")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
BIG_ENDIAN = sys.byteorder == "big"
assert array("Q").itemsize == 8

Cols = tuple  # (keys, seqnos, cas, revs, deleted, values): one block's columns


#: blocks of at most this many items get their header and numeric columns from one ``struct``
#: call: a tailing writer's flush is one to a few items per partition, and four arrays per block
#: were most of the flusher's Python per partition (``bench.bench_flush_round``)
SMALL_BLOCK_ITEMS = 32
_SMALL_HEADS = [struct.Struct(f"<IIQ{4 * n}Q") for n in range(SMALL_BLOCK_ITEMS + 1)]


def encode_block(keys: Sequence[bytes], seqnos: Sequence[int], cas: Sequence[int], revs: Sequence[int],
                 deleted: Sequence[int], values: Sequence[bytes]) -> bytes:
    """One block for a non-empty run of items in seqno order (columns as in the module doc)."""
    n = len(values)
    kblob = KEY_SEP.join(keys)
    base = BLOCK_HEADER.size + 33 * n + len(kblob)  # where the values blob starts
    if n <= SMALL_BLOCK_ITEMS:  # the same bytes, little-endian by the format string
        ends = list(accumulate(map(len, values), initial=base))
        head = _SMALL_HEADS[n].pack(n, len(kblob), ends[-1] - base, *seqnos, *cas, *revs, *ends[1:])
        return b"".join((head, bytes(deleted), kblob, *values))
    vends = array("Q", accumulate(map(len, values), initial=base))
    del vends[0]
    cols = [array("Q", seqnos), array("Q", cas), array("Q", revs), vends]
    if BIG_ENDIAN:  # pragma: no cover - little-endian machines only in CI
        for col in cols:
            col.byteswap()
    return b"".join((BLOCK_HEADER.pack(n, len(kblob), vends[-1] - base), *cols, bytes(deleted), kblob, *values))


def decode_block(blob: bytes) -> Cols:
    """(keys list, seqnos, cas, revs as ``array('Q')``, deleted bytes (0/1), values list)."""
    n, klen, vlen = BLOCK_HEADER.unpack_from(blob)
    o = BLOCK_HEADER.size + 32 * n
    nums = array("Q")
    nums.frombytes(memoryview(blob)[BLOCK_HEADER.size : o])  # the four u64 columns in one copy
    if BIG_ENDIAN:  # pragma: no cover
        nums.byteswap()
    vends = nums[3 * n :]
    deleted = blob[o : o + n]
    o += n
    keys = blob[o : o + klen].split(KEY_SEP)
    o += klen
    if len(keys) != n or o + vlen != len(blob) or (n and vends[-1] != len(blob)):
        raise CorruptStore(f"block of {n} items at seqno {nums[0] if n else '?'} does not decode")
    starts = array("Q", (o,))
    starts += vends[:-1]
    values = list(map(blob.__getitem__, map(slice, starts, vends)))  # no copy of the values region
    return keys, nums[:n], nums[n : 2 * n], nums[2 * n : 3 * n], deleted, values


def block_span(key: bytes, blob: bytes) -> tuple[int, int, int]:
    """(items, first seqno, last seqno) of a block without decoding it."""
    n = _U32.unpack_from(blob)[0]
    return n, int.from_bytes(key, "big"), _U64.unpack_from(blob, BLOCK_HEADER.size + 8 * (n - 1))[0]


def block_value(blob: bytes, seqno: int) -> bytes | None:
    """The value of ``seqno`` in ``blob`` without decoding the rest; None if it is not there."""
    n, klen, _vlen = BLOCK_HEADER.unpack_from(blob)
    o = BLOCK_HEADER.size
    seqnos = array("Q")
    seqnos.frombytes(memoryview(blob)[o : o + 8 * n])
    if BIG_ENDIAN:  # pragma: no cover
        seqnos.byteswap()
    i = bisect_left(seqnos, seqno)
    if i == n or seqnos[i] != seqno:
        return None
    ends = o + 24 * n
    start = _U64.unpack_from(blob, ends + 8 * (i - 1))[0] if i else o + 33 * n + klen
    return blob[start : _U64.unpack_from(blob, ends + 8 * i)[0]]


def split_blocks(keys: Sequence[bytes], seqnos: Sequence[int], cas: Sequence[int], revs: Sequence[int],
                 deleted: Sequence[int], values: Sequence[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """(by-seqno key, block) records for a run of items, cut by ``BLOCK_ITEMS``/``BLOCK_VALUE_BYTES``."""
    n = len(seqnos)
    if n <= BLOCK_ITEMS and sum(map(len, values)) <= BLOCK_VALUE_BYTES:
        yield SEQNO.pack(seqnos[0]), encode_block(keys, seqnos, cas, revs, deleted, values)
        return
    sizes = list(accumulate(map(len, values)))
    a = 0
    base = 0
    while a < n:
        b = min(a + BLOCK_ITEMS, n)
        b = max(a + 1, min(b, bisect_right(sizes, base + BLOCK_VALUE_BYTES, a, b)))
        yield SEQNO.pack(seqnos[a]), encode_block(keys[a:b], seqnos[a:b], cas[a:b], revs[a:b], deleted[a:b],
                                                  values[a:b])
        base = sizes[b - 1]
        a = b


def is_small(n: int, value_bytes: int) -> bool:
    """A block worth merging: under half full by items and by bytes."""
    return 2 * n < BLOCK_ITEMS and 2 * value_bytes < BLOCK_VALUE_BYTES


def compress_cols(cols: Cols, keep: Sequence[bool]) -> Cols:
    """The items of ``cols`` whose ``keep`` flag is true (C-level ``compress`` per column)."""
    keys, seqnos, cas, revs, deleted, values = cols
    return (list(compress(keys, keep)), array("Q", compress(seqnos, keep)), array("Q", compress(cas, keep)),
            array("Q", compress(revs, keep)), bytes(compress(deleted, keep)), list(compress(values, keep)))


class ColsBuffer:
    """Columns accumulated from several blocks (C-level extends)."""

    __slots__ = ("keys", "seqnos", "cas", "revs", "deleted", "values")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.seqnos = array("Q")
        self.cas = array("Q")
        self.revs = array("Q")
        self.deleted = bytearray()
        self.values: list[bytes] = []

    def extend(self, cols: Cols) -> None:
        keys, seqnos, cas, revs, deleted, values = cols
        self.keys += keys
        self.seqnos += seqnos
        self.cas += cas
        self.revs += revs
        self.deleted += deleted
        self.values += values

    def __len__(self) -> int:
        return len(self.seqnos)

    def columns(self) -> Cols:
        return self.keys, self.seqnos, self.cas, self.revs, bytes(self.deleted), self.values


def seek_block(cursor: lmdb.Cursor, first: bytes) -> bool:
    """Put ``cursor`` on the block that may hold seqno ``first`` (the last block starting at or
    before it, else the first block after it); False when the tree is empty."""
    if cursor.set_range(first):
        if cursor.key() != first:
            cursor.prev() or cursor.first()
        return True
    return cursor.last()
