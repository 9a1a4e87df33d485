"""Bundle frames: several stream messages carried by one binary WebSocket message.

Theory of operation
-------------------
A live tail sends, per partition visited, a ``snapshot`` marker (text) and an item batch (binary
or text), and the messages are small: at 20k writes/s over 64 partitions a visit carries a few
items.  Each WebSocket message costs the server a fixed amount of Python (Starlette -> uvicorn ->
websockets -> transport) whatever its size, so with 50 consumers the per-message cost, not the
items, bounds fan-out (see docs/benchmarks.md, Stream: fan-out).  A client that says ``bundle: true`` in ``hello`` accepts *bundles*: one
binary message holding, in order, the messages the server would otherwise have sent one by one.
Nothing else changes: the parts are exactly those messages (same bytes), in the same order, so a
snapshot marker still precedes its batches and a cookie (sent as its own message, after the
bundle carrying the items it covers) still follows them.  Flow control counts the bundle's
WebSocket message size, as for any other frame; the client acknowledges that size once it has
processed every part.  The other way, a client that said ``bundle: true`` may send a bundle of
text messages (a replica's ``seqno_ack``s for many partitions): the server handles its parts in
order as if each had come alone (``ServerSession.receive_binary``).

Layout, all integers little-endian::

    offset  size   field
    0       4      magic b"UPRM"
    4       1      version (1)
    5       1      flags (0)
    6       2      reserved (0)
    8       4      count n (u32, at least 1)
    12      4      reserved (0)
    16      ...    n parts, each: kind (u8: 1 = text message, UTF-8 JSON; 2 = binary item
                   batch frame), 3 reserved bytes (0), length L (u32), then L bytes

The message length must be exactly the header plus the parts.  Any inconsistency raises
``ProtocolError(corrupt_frame)`` naming the field.  A binary item batch frame starts with
``b"UPRB"`` (``frames.MAGIC``), so a client tells the two binary messages apart by the magic.

``Bundler`` (sans-I/O) decides what goes together: parts are added until the next one would take
the bundle past ``max_bytes`` (so flow control's overshoot stays bounded by one frame, as before);
a single pending part is sent as itself (no wrapper).

The header is the one item batch frames use, checked by ``engine.protocol.binary_header`` for both.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

from engine.protocol.binary_header import HEADER, BinaryFormat

__all__ = ["BUNDLE", "BUNDLE_MAGIC", "Bundler", "OVERHEAD", "PART_BINARY", "PART_TEXT", "bundle_cuts",
           "bundle_of_encoded", "bundle_pieces", "bundle_spans", "decode_bundle", "encode_bundle", "encode_parts", "is_bundle"]

BUNDLE_MAGIC = b"UPRM"
BUNDLE_VERSION = 1
BUNDLE = BinaryFormat("bundle", BUNDLE_MAGIC, BUNDLE_VERSION)
PART = struct.Struct("<B3xI")
_PART_WORDS = struct.Struct("<II")  # a part header as two words: kind | reserved << 8, length
PART_TEXT = 1
PART_BINARY = 2
#: bytes a bundle adds to its parts: the header once, a part header per part
OVERHEAD = HEADER.size


is_bundle = BUNDLE.matches


def encode_bundle(parts: Sequence[str | bytes]) -> bytes:
    """One bundle message for ``parts`` (text messages are pure ASCII, as the server sends them)."""
    if not parts:
        raise ValueError("a bundle needs at least one part")
    return bundle_of_encoded(len(parts), encode_parts(parts))


def encode_parts(parts: Sequence[str | bytes]) -> bytes:
    """``parts`` laid out as a bundle's parts (each with its part header), without the bundle
    header.  WHY apart: a shared pass (``engine.protocol.shared_pass``) lays out a partition's
    messages once and many bundles reuse the bytes (``bundle_of_encoded``)."""
    chunks: list[bytes] = []
    pack = PART.pack
    for part in parts:
        if isinstance(part, str):
            data = part.encode("utf-8")
            chunks.append(pack(PART_TEXT, len(data)))
        else:
            data = part
            chunks.append(pack(PART_BINARY, len(data)))
        chunks.append(data)
    return b"".join(chunks)


def bundle_cuts(sizes: Sequence[int], max_bytes: int) -> list[int] | None:
    """How a pass of laid-out pieces (``sizes``: bytes of each, parts and part headers, in
    order; 0 for a piece with no part) splits into bundles of at most ``max_bytes`` each, in
    order, each as full as it can be: the end index (exclusive) of each bundle, the last one
    ``len(sizes)``.  None when one piece alone does not fit a bundle.  A bundle's size on the
    wire is ``OVERHEAD`` plus its pieces."""
    cuts: list[int] = []
    size = 0
    room = max_bytes - OVERHEAD
    for i, n in enumerate(sizes):
        if n > room:
            return None
        if size + n > room:
            cuts.append(i)
            size = 0
        size += n
    cuts.append(len(sizes))
    return cuts


def bundle_of_encoded(count: int, *encoded: bytes) -> bytes:
    """One bundle message of ``count`` parts already laid out by ``encode_parts`` (in order)."""
    return b"".join(bundle_pieces(count, *encoded))


def bundle_pieces(count: int, *encoded: bytes) -> list[bytes]:
    """``bundle_of_encoded`` before the join: the bundle header, then ``encoded`` as they are.
    WHY apart: a writer that sends the pieces side by side (``transport.writelines``) sends a
    shared pass's bytes to every connection without copying them."""
    if count < 1:
        raise ValueError("a bundle needs at least one part")
    return [BUNDLE.pack_header(0, 0, count), *encoded]


_corrupt = BUNDLE.corrupt


def decode_bundle(data: bytes | bytearray | memoryview) -> list[str | bytes]:
    """The parts of a bundle, in order: ``str`` for text messages, ``bytes`` for binary frames."""
    view = memoryview(data).cast("B")
    parts: list[str | bytes] = []
    for i, (kind, start, end) in enumerate(bundle_spans(view)):
        chunk = bytes(view[start:end])
        if kind == PART_BINARY:
            parts.append(chunk)
        else:
            try:
                parts.append(chunk.decode("utf-8"))
            except UnicodeDecodeError:
                raise _corrupt("kind", f"part {i}: text part is not UTF-8") from None
    return parts


def bundle_spans(data: bytes | bytearray | memoryview) -> list[tuple[int, int, int]]:
    """Where a bundle's parts are, in order: ``(kind, start, end)`` offsets into ``data``, the
    whole layout checked (``ProtocolError(corrupt_frame)`` naming the field otherwise).

    WHY apart from ``decode_bundle``: a reader that needs only some parts (a subscriber skipping
    snapshot markers, taking only values) cuts out those, without copying the others."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    size = len(view)
    _, reserved, count = BUNDLE.check_header(view)
    if reserved:
        raise _corrupt("reserved", "must be 0")
    if count < 1:
        raise _corrupt("count", "a bundle holds at least one part")
    spans: list[tuple[int, int, int]] = []
    off = HEADER.size
    unpack = _PART_WORDS.unpack_from
    for i in range(count):
        if off + PART.size > size:
            raise _corrupt("count", f"part {i} of {count} starts past the end of the message")
        word, length = unpack(view, off)
        kind = word & 0xFF
        if word >> 8:
            raise _corrupt("reserved", f"part {i}: must be 0")
        off += PART.size
        if off + length > size:
            raise _corrupt("length", f"part {i} of {length} bytes runs past the end of the message")
        if kind != PART_BINARY and kind != PART_TEXT:
            raise _corrupt("kind", f"part {i}: unknown kind {kind}")
        spans.append((kind, off, off + length))
        off += length
    if off != size:
        raise _corrupt("length", f"{size - off} bytes after the last part")
    return spans


class Bundler:
    """Collects the messages of a pass into bundles of at most ``max_bytes`` (sans-I/O).

    The caller asks ``fits(size)`` before ``add``: when the part does not fit with the pending
    ones it sends ``flush()`` first (a part bigger than ``max_bytes`` always fits an empty
    bundler, and goes alone).  ``flush`` returns what is pending, the part itself when there is
    only one, or None.  ``pending_bytes`` is the size of the pending parts without the bundle's
    own header bytes."""

    __slots__ = ("max_bytes", "_parts", "pending_bytes")

    def __init__(self, max_bytes: int = 64 * 1024) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._parts: list[str | bytes] = []
        self.pending_bytes = 0

    def __len__(self) -> int:
        return len(self._parts)

    def fits(self, size: int) -> bool:
        n = len(self._parts)
        return n == 0 or OVERHEAD + PART.size * (n + 1) + self.pending_bytes + size <= self.max_bytes

    def fits_all(self, count: int, size: int) -> bool:
        """Whether ``count`` more parts of ``size`` bytes in all fit with the pending ones, with
        no flush in between (unlike ``fits``, an empty bundler is no exception)."""
        return OVERHEAD + PART.size * (len(self._parts) + count) + self.pending_bytes + size <= self.max_bytes

    def add(self, part: str | bytes) -> None:
        self._parts.append(part)
        self.pending_bytes += len(part)

    def flush(self) -> str | bytes | None:
        parts, self._parts = self._parts, []
        self.pending_bytes = 0
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        return encode_bundle(parts)
