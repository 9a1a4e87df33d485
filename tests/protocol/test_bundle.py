"""Bundle frames (engine.protocol.bundle): layout, every corruption named, and the Bundler's cuts."""
from __future__ import annotations

import struct

import pytest

from engine.protocol.bundle import (
    BUNDLE_MAGIC,
    OVERHEAD,
    bundle_cuts,
    HEADER,
    PART,
    PART_BINARY,
    PART_TEXT,
    Bundler,
    bundle_spans,
    decode_bundle,
    encode_bundle,
    is_bundle,
)
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.frames import decode_binary, encode_binary
from engine.core.types import Item

MARKER = '{"type":"snapshot","partition":3,"start":5,"end":6,"source":"memory","purge_seqno":0}'
BATCH = encode_binary(3, [Item(b"k", 5, 1, 1, False, b"v"), Item(b"j", 6, 2, 1, True, b"")], True)


@pytest.mark.parametrize("parts", [
    [MARKER],
    [BATCH],
    [MARKER, BATCH],
    [MARKER, BATCH, MARKER, BATCH, '{"type":"cycle_complete","cycle":1}'],
    ["", b""],
])
def test_round_trip_keeps_every_part_and_its_kind_in_order(parts: list[str | bytes]) -> None:
    data = encode_bundle(parts)
    assert is_bundle(data) and not is_bundle(BATCH)
    assert decode_bundle(data) == parts
    assert len(data) == HEADER.size + sum(PART.size + len(p) for p in parts)


def test_layout_is_the_documented_one() -> None:
    data = encode_bundle([MARKER, BATCH])
    assert data[:16] == BUNDLE_MAGIC + bytes([1, 0, 0, 0]) + struct.pack("<II", 2, 0)
    kind, length = PART.unpack_from(data, 16)
    assert (kind, length) == (PART_TEXT, len(MARKER))
    off = 16 + PART.size + len(MARKER)
    assert PART.unpack_from(data, off) == (PART_BINARY, len(BATCH))
    assert decode_binary(data[off + PART.size:]).last


def _patch(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new):]


GOOD = encode_bundle([MARKER, BATCH])
P2 = 16 + PART.size + len(MARKER)  # offset of the second part's header


@pytest.mark.parametrize("data, field", [
    (GOOD[:10], "header"),
    (_patch(GOOD, 0, b"UPRX"), "magic"),
    (_patch(GOOD, 4, b"\x02"), "version"),
    (_patch(GOOD, 5, b"\x01"), "flags"),
    (_patch(GOOD, 6, b"\x01"), "reserved"),
    (_patch(GOOD, 12, b"\x01"), "reserved"),
    (_patch(GOOD, 8, struct.pack("<I", 0)), "count"),
    (_patch(GOOD, 8, struct.pack("<I", 3)), "count"),
    (_patch(GOOD, 8, struct.pack("<I", 1)), "length"),  # bytes left after the last part
    (GOOD[:-1], "length"),  # the last part runs past the end
    (_patch(GOOD, P2, b"\x07"), "kind"),
    (_patch(GOOD, P2 + 1, b"\x01"), "reserved"),
    (_patch(GOOD, P2 + 3, b"\x01"), "reserved"),
    (encode_bundle([b"\xff\xfe"])[:16] + PART.pack(PART_TEXT, 2) + b"\xff\xfe", "kind"),  # text not UTF-8
])
def test_every_corruption_is_refused_naming_the_field(data: bytes, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_bundle(data)
    assert info.value.code == ErrorCode.CORRUPT_FRAME and info.value.field == field


def test_spans_point_at_each_part_in_order() -> None:
    parts: list[str | bytes] = [MARKER, BATCH, '{"type":"cycle_complete","cycle":1}']
    data = encode_bundle(parts)
    spans = bundle_spans(data)
    assert [k for k, _, _ in spans] == [PART_TEXT, PART_BINARY, PART_TEXT]
    assert [data[a:b] for _, a, b in spans] == [MARKER.encode(), BATCH, parts[2].encode()]  # type: ignore[union-attr]


def test_encoding_nothing_is_a_usage_error() -> None:
    with pytest.raises(ValueError):
        encode_bundle([])


# Bundler: (max_bytes, sizes of the parts added) -> the messages sent, as lists of part sizes
# (a single part goes out as itself, shown as an int).
@pytest.mark.parametrize("max_bytes, sizes, sent", [
    (1000, [100], [100]),                          # one part: no wrapper
    (1000, [100, 200], [[100, 200]]),              # a marker and its batch: one message
    (1000, [400, 400, 400], [[400, 400], 400]),    # the third does not fit with the header bytes
    (1000, [2000, 10], [2000, 10]),                # bigger than max_bytes: alone
    (1000, [10, 2000], [10, 2000]),                # ... also after a small one
    (16 + 2 * 8 + 60, [30, 30], [[30, 30]]),       # exactly max_bytes with the header bytes
    (16 + 2 * 8 + 59, [30, 30], [30, 30]),         # one byte over
])
def test_bundler_cuts_at_max_bytes_counting_its_own_header_bytes(max_bytes: int, sizes: list[int],
                                                                 sent: list[object]) -> None:
    bundler = Bundler(max_bytes)
    out: list[str | bytes] = []
    pending = 0
    for i, size in enumerate(sizes):
        if not bundler.fits(size):
            flushed = bundler.flush()
            assert flushed is not None
            out.append(flushed)
            pending = 0
        bundler.add(bytes([i]) * size)
        pending += size
        assert bundler.pending_bytes == pending  # what the server has counted against the window
    last = bundler.flush()
    assert last is not None and bundler.flush() is None and len(bundler) == 0 and bundler.pending_bytes == 0
    out.append(last)
    shapes = [[len(p) for p in decode_bundle(m)] if is_bundle(m) else len(m) for m in out]
    assert shapes == sent
    assert all(len(m) <= max_bytes for m in out if is_bundle(m))


# fits_all: (max_bytes, sizes already pending, parts to add, their bytes) -> whether they all fit
# with no flush in between (the stream server then adds them without suspending).
@pytest.mark.parametrize("max_bytes, pending, count, size, fits", [
    (1000, [], 2, 300, True),                      # marker and batch into an empty bundle
    (16 + 2 * 8 + 60, [], 2, 60, True),            # exactly max_bytes with the header bytes
    (16 + 2 * 8 + 61, [], 2, 62, False),           # one byte over
    (1000, [], 1, 2000, False),                    # bigger than the bundle: unlike fits, no exception
    (16 + 3 * 8 + 90, [30], 2, 60, True),          # with what is pending
    (16 + 3 * 8 + 90, [31], 2, 60, False),
    (1000, [500], 0, 0, True),                     # an idle visit adds nothing
])
def test_fits_all_counts_pending_parts_and_header_bytes(max_bytes: int, pending: list[int], count: int,
                                                        size: int, fits: bool) -> None:
    bundler = Bundler(max_bytes)
    for n in pending:
        bundler.add(b"x" * n)
    assert bundler.fits_all(count, size) is fits
    if fits and count:
        for i in range(count):
            bundler.add(b"y" * (size // count + (1 if i < size % count else 0)))
        flushed = bundler.flush()
        assert flushed is not None and (len(flushed) <= max_bytes or not is_bundle(flushed))


@pytest.mark.parametrize("sizes, max_bytes, cuts", [
    ([], 100, [0]),
    ([10, 20, 30], 100, [3]),
    ([40, 40, 40], 16 + 80, [2, 3]),  # the header counts: two pieces fill a bundle
    ([40, 0, 40, 0, 40], 16 + 80, [4, 5]),  # an idle piece rides with the bundle before it
    ([80, 1], 16 + 80, [1, 2]),
    ([81], 16 + 80, None),  # one piece larger than a bundle
    ([10, 81], 16 + 80, None),
])
def test_bundle_cuts_fill_each_bundle_in_order(sizes: list[int], max_bytes: int, cuts: list[int] | None) -> None:
    assert OVERHEAD == 16
    assert bundle_cuts(sizes, max_bytes) == cuts
    if cuts is not None:
        start = 0
        for end in cuts:
            assert OVERHEAD + sum(sizes[start:end]) <= max_bytes
            if end < len(sizes):  # as full as it may be: the next piece would not fit
                assert OVERHEAD + sum(sizes[start:end + 1]) > max_bytes
            start = end
