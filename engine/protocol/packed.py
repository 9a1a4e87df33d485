"""Packed passes: a whole pass's snapshot markers and item batches in one binary message part.

Theory of operation
-------------------
A live tail sends, per partition visited, a ``snapshot`` marker (text) and an item batch
(binary); bundles (``engine.protocol.bundle``) put a pass's messages in one WebSocket message,
but the consumer still splits, decodes and processes each part on its own: two messages per
partition visit, and at a replica's pace a visit carries about one item, so the per-message
work is most of the per-item work (``bench.replica_apply_cpu``).  A client that says
``frames: "packed"`` in ``hello`` (with ``codec: "binary"`` and ``bundle: true``) accepts a
*packed pass* in place of a run of markers and batches: one binary part holding, in order, one
*section* per batch, each with the fields of the marker that precedes it (if one does) and the
batch frame itself.  The consumer decodes it in one call and processes it as the messages it
stands for, in the same order; nothing else changes: a marker's meaning, order per partition,
cookies and stream ends (sent as their own messages after the pass, as before), flow control
(the pass's bytes are counted like any other message's).  A packed pass travels alone as a
WebSocket message or as a binary part of a bundle (told apart from a batch by its magic); the
server may still send plain markers and batches (a catch-up visit produced on its own), so a
client that asked for packed passes takes both.

Layout, all integers little-endian::

    offset  size   field
    0       4      magic b"UPRP"
    4       1      version (1)
    5       1      flags (0)
    6       2      reserved (0)
    8       4      count m (u32, at least 1): sections
    12      4      reserved (0)
    16      ...    m sections, each:
                   0   2  partition (u16)
                   2   1  flags: bit 0 = a snapshot marker precedes the batch; other bits 0
                   3   1  the marker's source: 0 memory, 1 disk (0 without a marker)
                   4   4  length L of the batch frame (u32)
                   8   8  the marker's start (u64; 0 without a marker)
                   16  8  the marker's end
                   24  8  the marker's purge seqno
                   32  L  a binary item batch frame (``engine.protocol.frames``) of that partition

WHY the batch frame whole inside its section: the sender's readings are encoded once and shared
by every connection at the same positions (``engine.protocol.shared_pass``), and a section is
that frame with 32 bytes before it, so packing a pass copies no items; the 16 bytes of the
frame's own header are the price, and they keep one decoder (and its checks) for every batch.

Any inconsistency (header, truncation, trailing bytes, a section's flags or source, a batch of
another partition, a corrupt batch) raises ``ProtocolError(corrupt_frame)`` naming the field.
A marker with no batch after it is never packed (the sender sends such a visit as messages).
"""
from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from engine.protocol.binary_header import HEADER, BinaryFormat
from engine.protocol.frames import _SMALL_BATCH, _SMALL_COLUMNS, FLAG_LAST, ITEM_BATCH, MAGIC, PER_ITEM_BYTES, VERSION
from engine.protocol.frames import ItemBatch, decode_binary
from engine.protocol.message_types import SnapshotMarker, SnapshotSource

__all__ = ["PACKED", "PACKED_MAGIC", "SECTION", "PackedPass", "Section", "decode_packed", "encode_packed",
           "is_packed", "pack_messages", "packed_header", "section_bytes"]

PACKED_MAGIC = b"UPRP"
PACKED_VERSION = 1
PACKED = BinaryFormat("packed pass", PACKED_MAGIC, PACKED_VERSION)
SECTION = struct.Struct("<HBBIQQQ")
FLAG_MARKER = 0x01
SOURCES = (SnapshotSource.MEMORY, SnapshotSource.DISK)
_SOURCE_CODE = {SnapshotSource.MEMORY: 0, SnapshotSource.DISK: 1, "memory": 0, "disk": 1}
#: bytes a section adds to its batch frame
SECTION_OVERHEAD = SECTION.size

is_packed = PACKED.matches
_corrupt = PACKED.corrupt


class Section(NamedTuple):
    """One batch of a packed pass and the marker before it: ``marker`` is ``(start, end, source,
    purge_seqno)`` or None when the batch continues the snapshot of an earlier section."""

    partition: int
    marker: tuple[int, int, SnapshotSource, int] | None
    batch: ItemBatch


class PackedPass:
    """A decoded packed pass: its sections in order, and the messages they stand for."""

    __slots__ = ("sections",)

    def __init__(self, sections: list[Section]) -> None:
        self.sections = sections

    def __len__(self) -> int:
        return len(self.sections)

    def messages(self) -> Iterator[SnapshotMarker | ItemBatch]:
        """The markers and batches the pass stands for, in order (what a consumer that
        processes message by message takes)."""
        for p, marker, batch in self.sections:
            if marker is not None:
                start, end, source, purge = marker
                yield SnapshotMarker(p, start, end, source, purge)
            yield batch

    def __repr__(self) -> str:
        return f"PackedPass({len(self.sections)} sections)"


def section_bytes(partition: int, marker: tuple[int, int, str, int] | None, frame: bytes) -> bytes:
    """One section: ``marker`` (start, end, source, purge seqno; None: no marker) and ``frame``,
    a binary item batch frame of ``partition``."""
    if marker is None:
        head = SECTION.pack(partition, 0, 0, len(frame), 0, 0, 0)
    else:
        start, end, source, purge = marker
        head = SECTION.pack(partition, FLAG_MARKER, _SOURCE_CODE[source], len(frame), start, end, purge)
    return head + frame


def packed_header(count: int) -> bytes:
    """The header of a packed pass of ``count`` sections (laid out by ``section_bytes``)."""
    if count < 1:
        raise ValueError("a packed pass needs at least one section")
    return PACKED.pack_header(0, 0, count)


def encode_packed(sections: Sequence[tuple[int, tuple[int, int, str, int] | None, bytes]]) -> bytes:
    """A packed pass of ``sections``: (partition, marker or None, batch frame) each, in order."""
    return b"".join([packed_header(len(sections)), *(section_bytes(*s) for s in sections)])


def pack_messages(messages: Sequence[tuple[Any, ...]]) -> list[tuple[int, tuple[int, int, str, int] | None, bytes]] | None:
    """Markers and batch frames in sending order as sections: ``("marker", partition, start,
    end, source, purge_seqno)`` and ``("batch", partition, frame)``; None when they cannot be
    packed (a marker not followed by a batch of its partition)."""
    out: list[tuple[int, tuple[int, int, str, int] | None, bytes]] = []
    pending: tuple[int, tuple[int, int, str, int]] | None = None
    for msg in messages:
        if msg[0] == "marker":
            if pending is not None:
                return None
            pending = (msg[1], (msg[2], msg[3], msg[4], msg[5]))
        else:
            p, frame = msg[1], msg[2]
            if pending is not None:
                if pending[0] != p:
                    return None
                out.append((p, pending[1], frame))
                pending = None
            else:
                out.append((p, None, frame))
    return None if pending is not None else out


def decode_packed(data: bytes | bytearray | memoryview) -> PackedPass:
    """Decode a packed pass; ``ProtocolError(corrupt_frame)`` if it is not exactly well-formed."""
    if not isinstance(data, bytes):
        data = bytes(memoryview(data).cast("B"))  # one copy: the batches' keys and values are cut from it
    view = memoryview(data)
    size = len(view)
    _flags, reserved, count = PACKED.check_header(view)
    if reserved:
        raise _corrupt("reserved", "must be 0")
    if count < 1:
        raise _corrupt("count", "a packed pass holds at least one section")
    sections: list[Section] = []
    append = sections.append
    unpack = SECTION.unpack_from
    off = HEADER.size
    head = SECTION.size
    for i in range(count):
        if off + head > size:
            raise _corrupt("count", f"section {i} of {count} starts past the end of the message")
        p, flags, source, length, start, end, purge = unpack(view, off)
        off += head
        if off + length > size:
            raise _corrupt("length", f"section {i}: a batch of {length} bytes runs past the end of the message")
        if flags & ~FLAG_MARKER:
            raise _corrupt("flags", f"section {i}: unknown flag bits {flags:#04x}")
        if source >= len(SOURCES) or (source and not flags):
            raise _corrupt("source", f"section {i}: unknown source {source}")
        batch = _batch(data, view, off, length)
        if batch.partition != p:
            raise _corrupt("partition", f"section {i} of partition {p} holds a batch of partition {batch.partition}")
        off += length
        if flags:
            if start > end:
                raise _corrupt("start", f"section {i}: marker start {start} > end {end}")
            append(Section(p, (start, end, SOURCES[source], purge), batch))
        else:
            if start or end or purge:
                raise _corrupt("start", f"section {i}: marker fields without a marker must be 0")
            append(Section(p, None, batch))
    if off != size:
        raise _corrupt("length", f"{size - off} bytes after the last section")
    return PackedPass(sections)


_BATCH_HEADER = HEADER
_corrupt_batch = ITEM_BATCH.corrupt


def _batch(data: bytes, view: memoryview, off: int, length: int) -> ItemBatch:
    """The batch frame of ``length`` bytes at ``off``: ``decode_binary``'s result and checks,
    with a small batch's fixed-width columns read by one ``struct`` call (tuples, not arrays).

    WHY: at a replica's pace a section holds one or a few items, and five arrays and their
    copies per batch cost more than its items (``bench.replica_apply_cpu``)."""
    if length < _BATCH_HEADER.size:
        return decode_binary(view[off:off + length])  # raises the precise error
    magic, version, flags, p, n, reserved = _BATCH_HEADER.unpack_from(view, off)
    if magic != MAGIC or version != VERSION or flags & ~FLAG_LAST or reserved or not 0 < n <= _SMALL_BATCH:
        return decode_binary(view[off:off + length])  # the general case, or the precise error
    start = off + _BATCH_HEADER.size
    fixed_end = start + PER_ITEM_BYTES * n
    end = off + length
    if fixed_end > end:
        raise _corrupt_batch("count", f"{n} items need {fixed_end - off} bytes of columns; the frame has {length}")
    cols = _SMALL_COLUMNS[n].unpack_from(view, start)
    seqnos, cas, revs = cols[:n], cols[n:2 * n], cols[2 * n:3 * n]
    key_ends, value_ends = cols[3 * n:4 * n], cols[4 * n:]
    deleted = bytes(view[fixed_end - n:fixed_end])
    if deleted.translate(None, b"\x00\x01"):
        raise _corrupt_batch("deleted", "flags must be 0 or 1")
    keys_len, values_len = key_ends[-1], value_ends[-1]
    if fixed_end + keys_len + values_len != end:
        raise _corrupt_batch("length", f"header and offsets describe {fixed_end - off + keys_len + values_len} "
                                       f"bytes; the frame has {length}")
    blob = data
    k0 = fixed_end
    v0 = k0 + keys_len
    if n == 1:
        keys = [blob[k0:v0]]
        values = [blob[v0:end]]
    else:
        if list(key_ends) != sorted(key_ends):
            raise _corrupt_batch("key_ends", "offsets go backwards")
        if list(value_ends) != sorted(value_ends):
            raise _corrupt_batch("value_ends", "offsets go backwards")
        keys = [blob[k0 + a:k0 + b] for a, b in zip((0, *key_ends[:-1]), key_ends)]
        values = [blob[v0 + a:v0 + b] for a, b in zip((0, *value_ends[:-1]), value_ends)]
    return ItemBatch(p, bool(flags & FLAG_LAST), seqnos, cas, revs, deleted, keys, values)
