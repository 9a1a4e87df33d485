"""Item batch codecs: many items per frame, laid out so the consumer does little per-item work.

Theory of operation
-------------------
After a ``snapshot`` marker the server sends the snapshot's items in batches.  A batch is one
WebSocket frame holding the items of *one* partition, in seqno order, with a ``last`` flag on the
batch that completes the snapshot (then the consumer's position becomes the marker's ``end``).
Both codecs decode into the same ``ItemBatch``.

Binary codec (hello ``codec: "binary"``), all integers little-endian::

    offset  size   field
    0       4      magic b"UPRB"
    4       1      version (1)
    5       1      flags: bit 0 = last batch of its snapshot; other bits must be 0
    6       2      partition (u16)
    8       4      count n (u32)
    12      4      reserved, must be 0
    16      8n     seqnos   (u64[n])
            8n     cas      (u64[n])
            8n     revs     (u64[n])
            4n     key end offsets   (u32[n], non-decreasing, into the keys blob)
            4n     value end offsets (u32[n], non-decreasing, into the values blob)
            n      deleted  (u8[n], 0 or 1)
            K      keys blob   (K = last key end offset; UTF-8 keys back to back)
            V      values blob (V = last value end offset; raw bytes back to back)

The frame length must be exactly ``16 + 33n + K + V``.  Numeric columns decode with one
``array.frombytes`` each (a memcpy), keys and values are sliced out of their blobs by C-level
``map``; there is no per-item Python bytecode on the decode path.  The u64 columns come first so
they are 8-aligned within the frame.

JSON codec (``codec: "json"``): a text frame ``{"type": "items", "partition", "last", "seqnos",
"cas", "revs", "deleted" (0/1), "keys" (strings), "values" (base64 strings)}`` with columns of
equal length.  Text frames are pure ASCII (non-ASCII keys are ``\\u`` escaped), so their length in
characters is the byte count a consumer acknowledges.

Any inconsistency (bad magic/version/flags, truncation, trailing bytes, offsets going backwards,
columns of different lengths, non-0/1 deleted flags) raises ``ProtocolError`` with code
``corrupt_frame`` and the offending field.  The 16-byte header is the one bundles use too, and is
checked by ``engine.protocol.binary_header`` for both.
"""
from __future__ import annotations

import binascii
import json
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from engine.core.types import MAX_SEQNO, Item
from engine.protocol.binary_header import HEADER, BinaryFormat
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.json_text import parse_json

__all__ = [
    "Columns",
    "HEADER",
    "ITEM_BATCH",
    "JSON_FIELDS",
    "MAGIC",
    "VERSION",
    "ItemBatch",
    "decode_binary",
    "decode_json",
    "encode_binary",
    "encode_binary_columns",
    "encode_json",
    "encode_json_columns",
    "json_obj_to_batch",
    "live_values",
]

MAGIC = b"UPRB"
VERSION = 1
FLAG_LAST = 0x01
ITEM_BATCH = BinaryFormat("item batch", MAGIC, VERSION, FLAG_LAST)
PER_ITEM_BYTES = 8 * 3 + 4 * 2 + 1
MAX_BLOB_BYTES = 0xFFFFFFFF
MAX_PARTITION = 0xFFFF
_BIG_ENDIAN = sys.byteorder == "big"
_EMPTY_ITEMS: tuple[Item, ...] = ()
#: batches of at most this many items pack their fixed-width columns with one ``struct`` call
_SMALL_BATCH = 32
#: n -> the ``struct.Struct`` of n items' fixed-width columns (little-endian, as on the wire)
_SMALL_COLUMNS = [struct.Struct(f"<{3 * n}Q{2 * n}I") for n in range(_SMALL_BATCH + 1)]


@dataclass(frozen=True, slots=True)
class ItemBatch:
    """A decoded batch: one partition's items as columns (index i across columns = item i).

    ``deleted[i]`` is 0 or 1.  Iterate with ``rows()`` (plain tuples, cheapest) or ``items()``
    (``engine.core.types.Item``).
    """

    partition: int
    last: bool
    seqnos: Sequence[int]
    cas: Sequence[int]
    revs: Sequence[int]
    deleted: bytes
    keys: list[bytes]
    values: list[bytes]

    def __len__(self) -> int:
        return len(self.seqnos)

    def rows(self) -> Iterator[tuple[bytes, int, int, int, int, bytes]]:
        """(key, seqno, cas, rev, deleted 0/1, value) per item, in seqno order."""
        return zip(self.keys, self.seqnos, self.cas, self.revs, self.deleted, self.values)

    def items(self) -> Iterator[Item]:
        return map(Item._make, zip(self.keys, self.seqnos, self.cas, self.revs, map(bool, self.deleted), self.values))

    @property
    def last_seqno(self) -> int | None:
        return self.seqnos[-1] if len(self.seqnos) else None


_corrupt = ITEM_BATCH.corrupt


def _check_partition(partition: int) -> None:
    if not 0 <= partition <= MAX_PARTITION:
        raise ValueError(f"partition {partition} does not fit in u16")


# ----------------------------------------------------------------------------- binary


class Columns:
    """Items of one partition as columns, in ``Item`` field order (``columns[i]`` is field i
    for every item): what the snapshot reader produces for the encoders without building an
    ``Item`` per item.

    WHY: a by-seqno scan that builds one ``Item`` per record and then transposes them again in
    the encoder spends more time on the tuples than on LMDB; columns built with C-level
    ``zip``/``map``/``struct`` calls keep the per-item work out of Python bytecode.
    ``deleted`` holds bools or 0/1 ints.  ``len()`` is the item count (a batch may be empty)."""

    __slots__ = ("keys", "seqnos", "cas", "revs", "deleted", "values")

    def __init__(self, keys: Sequence[bytes], seqnos: Sequence[int], cas: Sequence[int], revs: Sequence[int],
                 deleted: Sequence[int], values: Sequence[bytes]) -> None:
        self.keys = keys
        self.seqnos = seqnos
        self.cas = cas
        self.revs = revs
        self.deleted = deleted
        self.values = values

    @classmethod
    def of_items(cls, items: Sequence[Item]) -> "Columns":
        """Transpose ``items`` (one C-level ``zip``)."""
        if not items:
            return cls((), (), (), (), (), ())
        return cls(*zip(*items))

    def __len__(self) -> int:
        return len(self.seqnos)

    def __iter__(self) -> Iterator[Item]:
        """The items, in order (tests and tools; the encoders never build them)."""
        return map(Item._make, zip(self.keys, self.seqnos, self.cas, self.revs, map(bool, self.deleted),
                                   self.values))

    @property
    def last_seqno(self) -> int | None:
        return self.seqnos[-1] if len(self.seqnos) else None

    def __repr__(self) -> str:
        return f"Columns(n={len(self)}, last_seqno={self.last_seqno})"


def encode_binary(partition: int, items: Sequence[Item], last: bool) -> bytes:
    """One binary frame for ``items`` (one partition, seqno order)."""
    _check_partition(partition)
    if items:
        return _encode_binary(partition, len(items), *zip(*items), last)  # type: ignore[call-arg]
    return _encode_binary(partition, 0, *(_EMPTY_ITEMS,) * 6, last)  # type: ignore[call-arg]


def encode_binary_columns(partition: int, columns: Columns, last: bool) -> bytes:
    """One binary frame for a ``Columns`` batch (the same bytes ``encode_binary`` makes for
    its items)."""
    _check_partition(partition)
    c = columns
    return _encode_binary(partition, len(c), c.keys, c.seqnos, c.cas, c.revs, c.deleted, c.values, last)


def _encode_binary(partition: int, n: int, keys: Sequence[bytes], seqnos: Sequence[int], cas: Sequence[int],
                   revs: Sequence[int], deleted: Sequence[int], values: Sequence[bytes], last: bool) -> bytes:
    if 0 < n <= _SMALL_BATCH:
        # WHY: a tailing consumer's batches hold a few items each, and five arrays per frame cost
        # more than the items (``bench.bench_tail_pass``); one packing call makes the same bytes
        try:
            fixed = _SMALL_COLUMNS[n].pack(*seqnos, *cas, *revs, *accumulate(map(len, keys)),
                                           *accumulate(map(len, values)))
        except struct.error:
            pass  # out of range: the arrays below raise the usual OverflowError
        else:
            header = ITEM_BATCH.pack_header(FLAG_LAST if last else 0, partition, n)
            return b"".join((header, fixed, bytes(deleted), b"".join(keys), b"".join(values)))
    key_ends = array("I", accumulate(map(len, keys)))
    value_ends = array("I", accumulate(map(len, values))) if n else array("I")
    # array("I", ...) raises OverflowError past 2^32-1: blobs are bounded by the u32 offsets.
    cols = [array("Q", seqnos), array("Q", cas), array("Q", revs), key_ends, value_ends]
    if _BIG_ENDIAN:  # pragma: no cover - little-endian machines only in CI
        for col in cols:
            col.byteswap()
    header = ITEM_BATCH.pack_header(FLAG_LAST if last else 0, partition, n)
    return b"".join([header, *(c.tobytes() for c in cols), bytes(deleted), b"".join(keys), b"".join(values)])


def decode_binary(data: bytes | bytearray | memoryview) -> ItemBatch:
    """Decode one binary frame; ``ProtocolError(corrupt_frame)`` if it is not exactly well-formed."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    size = len(view)
    flags, partition, n = ITEM_BATCH.check_header(view)
    fixed_end = HEADER.size + PER_ITEM_BYTES * n
    if size < fixed_end:
        raise _corrupt("count", f"{n} items need {fixed_end} bytes of columns; the frame has {size}")
    off = HEADER.size
    cols = []
    for code, width in (("Q", 8), ("Q", 8), ("Q", 8), ("I", 4), ("I", 4)):
        col = array(code)
        col.frombytes(view[off : off + width * n])
        if _BIG_ENDIAN:  # pragma: no cover
            col.byteswap()
        cols.append(col)
        off += width * n
    seqnos, cas, revs, key_ends, value_ends = cols
    deleted = bytes(view[off : off + n])
    off += n
    if deleted.translate(None, b"\x00\x01"):
        raise _corrupt("deleted", "flags must be 0 or 1")
    keys_len = key_ends[-1] if n else 0
    values_len = value_ends[-1] if n else 0
    if size != off + keys_len + values_len:
        raise _corrupt(
            "length", f"header and offsets describe {off + keys_len + values_len} bytes; the frame has {size}"
        )
    keys = _slices(bytes(view[off : off + keys_len]), key_ends.tolist(), "key_ends")
    values = _slices(bytes(view[off + keys_len : size]), value_ends.tolist(), "value_ends")
    return ItemBatch(partition, bool(flags & FLAG_LAST), seqnos, cas, revs, deleted, keys, values)


def live_values(data: bytes | bytearray | memoryview) -> list[bytes]:
    """The values of a binary frame's live (not deleted) items, in order, and nothing else.

    WHY: a reader that only wants documents (a subscriber measuring lag, a fan-out consumer)
    paid for the whole ``ItemBatch`` (five columns, every key cut out) on every frame; with one
    item per frame when tailing, that decode was most of such a consumer's CPU (profiled,
    docs/benchmarks.md, Peers).  The frame is checked exactly as ``decode_binary`` checks it
    (header, lengths, offsets, deleted flags): only the columns it does not return are not copied."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    size = len(view)
    _flags, _partition, n = ITEM_BATCH.check_header(view)
    fixed_end = HEADER.size + PER_ITEM_BYTES * n
    if size < fixed_end:
        raise _corrupt("count", f"{n} items need {fixed_end} bytes of columns; the frame has {size}")
    ends_at = HEADER.size + 24 * n
    key_ends = array("I")
    key_ends.frombytes(view[ends_at : ends_at + 4 * n])
    value_ends = array("I")
    value_ends.frombytes(view[ends_at + 4 * n : ends_at + 8 * n])
    if _BIG_ENDIAN:  # pragma: no cover
        key_ends.byteswap()
        value_ends.byteswap()
    off = fixed_end - n
    deleted = bytes(view[off:fixed_end])
    if deleted.translate(None, b"\x00\x01"):
        raise _corrupt("deleted", "flags must be 0 or 1")
    keys_len = key_ends[-1] if n else 0
    values_len = value_ends[-1] if n else 0
    if size != fixed_end + keys_len + values_len:
        raise _corrupt(
            "length", f"header and offsets describe {fixed_end + keys_len + values_len} bytes; the frame has {size}"
        )
    keys = key_ends.tolist()
    if keys != sorted(keys):
        raise _corrupt("key_ends", "offsets go backwards")
    values = _slices(bytes(view[fixed_end + keys_len : size]), value_ends.tolist(), "value_ends")
    if 1 in deleted:
        return [v for v, d in zip(values, deleted) if not d]
    return values


def _slices(blob: bytes, ends: list[int], field: str) -> list[bytes]:
    """Cut ``blob`` at ``ends`` (checked non-decreasing: a sorted() of sorted data is one C pass)."""
    if ends != sorted(ends):
        raise _corrupt(field, "offsets go backwards")
    starts = [0]
    starts += ends[:-1]
    return [blob[a:b] for a, b in zip(starts, ends)]


# ----------------------------------------------------------------------------- JSON


def encode_json(partition: int, items: Sequence[Item], last: bool) -> str:
    """One ``items`` text frame for ``items`` (values base64, keys as strings)."""
    _check_partition(partition)
    if items:
        return _encode_json(partition, *zip(*items), last)  # type: ignore[call-arg]
    return _encode_json(partition, *(_EMPTY_ITEMS,) * 6, last)  # type: ignore[call-arg]


def encode_json_columns(partition: int, columns: Columns, last: bool) -> str:
    """One ``items`` text frame for a ``Columns`` batch (same text as ``encode_json``)."""
    _check_partition(partition)
    c = columns
    return _encode_json(partition, c.keys, c.seqnos, c.cas, c.revs, c.deleted, c.values, last)


def _encode_json(partition: int, keys: Sequence[bytes], seqnos: Sequence[int], cas: Sequence[int],
                 revs: Sequence[int], deleted: Sequence[int], values: Sequence[bytes], last: bool) -> str:
    obj = {
        "type": "items",
        "partition": partition,
        "last": bool(last),
        "seqnos": list(seqnos),
        "cas": list(cas),
        "revs": list(revs),
        "deleted": list(map(int, deleted)),
        "keys": [k.decode("utf-8") for k in keys],
        "values": [binascii.b2a_base64(v, newline=False).decode("ascii") for v in values],
    }
    return json.dumps(obj, separators=(",", ":"))


def decode_json(text: str | bytes) -> ItemBatch:
    """Parse an ``items`` text frame (the client's ``messages.decode`` delegates here too)."""
    obj = parse_json(text)
    if type(obj) is not dict or obj.get("type") != "items":
        raise _corrupt("type", "expected an object of type 'items'")
    return json_obj_to_batch(obj)


JSON_FIELDS = ("type", "partition", "last", "seqnos", "cas", "revs", "deleted", "keys", "values")


def json_obj_to_batch(obj: dict[str, Any]) -> ItemBatch:
    """Validate a parsed ``items`` object and build its ``ItemBatch``."""
    for key in obj:
        if key not in JSON_FIELDS:
            raise ProtocolError(ErrorCode.UNKNOWN_FIELD, f"unknown field {key[:64]!r}", field=key[:64])
    for key in JSON_FIELDS:
        if key not in obj:
            raise ProtocolError(ErrorCode.MISSING_FIELD, f"missing field {key!r}", field=key)
    partition, last = obj["partition"], obj["last"]
    if type(partition) is not int or not 0 <= partition <= MAX_PARTITION:
        raise _corrupt("partition", "expected an integer 0..65535")
    if type(last) is not bool:
        raise _corrupt("last", "expected a boolean")
    columns = {name: obj[name] for name in ("seqnos", "cas", "revs", "deleted", "keys", "values")}
    for name, col in columns.items():
        if type(col) is not list:
            raise _corrupt(name, "expected a list")
    n = len(columns["seqnos"])
    for name, col in columns.items():
        if len(col) != n:
            raise _corrupt(name, f"has {len(col)} entries; seqnos has {n}")
    numeric = {}
    for name in ("seqnos", "cas", "revs"):
        col = columns[name]
        if not all(type(v) is int for v in col):
            raise _corrupt(name, "expected integers")
        try:
            numeric[name] = array("Q", col)
        except OverflowError:
            raise _corrupt(name, f"values must be 0..{MAX_SEQNO}") from None
    try:
        deleted = bytes(columns["deleted"])
    except (TypeError, ValueError):
        raise _corrupt("deleted", "expected 0 or 1 per item") from None
    if deleted.translate(None, b"\x00\x01") or not all(type(v) is int for v in columns["deleted"]):
        raise _corrupt("deleted", "expected 0 or 1 per item")
    try:
        keys = [k.encode("utf-8") for k in columns["keys"]]
    except (AttributeError, UnicodeEncodeError):
        raise _corrupt("keys", "expected strings") from None
    try:
        values = [binascii.a2b_base64(v, strict_mode=True) for v in columns["values"]]
    except (binascii.Error, TypeError, ValueError):
        raise _corrupt("values", "expected base64 strings") from None
    if not all(type(v) is str for v in columns["values"]):
        raise _corrupt("values", "expected base64 strings")
    return ItemBatch(partition, last, numeric["seqnos"], numeric["cas"], numeric["revs"], deleted, keys, values)
