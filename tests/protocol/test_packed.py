"""Packed passes (engine.protocol.packed): the messages a pass stands for, every corruption named."""
from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.stream.cursor import marker_text
from engine.core.types import Item
from engine.protocol import messages as M
from engine.protocol.client.incoming import decode_frame, split_bundle, unpacked
from engine.protocol.bundle import encode_bundle
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.frames import ItemBatch, encode_binary
from engine.protocol.packed import (
    HEADER,
    PACKED_MAGIC,
    SECTION,
    PackedPass,
    decode_packed,
    encode_packed,
    is_packed,
    pack_messages,
    packed_header,
    section_bytes,
)
from engine.protocol.shared_pass import PACKED_EXTRA, SharedReading
from engine.protocol.bundle import encode_parts


def _items(p: int, start: int, n: int, *, deleted_every: int = 0, size: int = 3) -> list[Item]:
    return [Item(b"k%d-%d" % (p, s), s, 1000 + s, 1 + s % 3, bool(deleted_every and s % deleted_every == 0),
                 b"" if deleted_every and s % deleted_every == 0 else b"v" * size)
            for s in range(start, start + n)]


def _norm(msg: Any) -> Any:
    """A message in a form that compares equal whatever its columns' container types."""
    if type(msg) is ItemBatch:
        return ("batch", msg.partition, msg.last, list(msg.rows()))
    return msg


def _as_messages(visits: list[tuple[int, tuple[int, int, str, int] | None, list[Item], bool]]) -> list[Any]:
    """What the server sends as messages for ``visits``, decoded as a client decodes them."""
    out = []
    for p, marker, items, last in visits:
        if marker is not None:
            out.append(decode_frame(marker_text(p, marker[0], marker[1], marker[2], marker[3])))
        out.append(decode_frame(encode_binary(p, items, last)))
    return out


def _as_packed(visits: list[tuple[int, tuple[int, int, str, int] | None, list[Item], bool]]) -> bytes:
    return encode_packed([(p, marker, encode_binary(p, items, last)) for p, marker, items, last in visits])


CASES = {
    "one visit, one item": [(3, (5, 5, "memory", 0), _items(3, 5, 1), True)],
    "a tail pass over partitions": [(p, (p + 1, p + 1, "memory", 0), _items(p, p + 1, 1), True) for p in range(8)],
    "several items, deletions": [(1, (10, 20, "memory", 4), _items(1, 10, 11, deleted_every=3), True)],
    "a snapshot over two batches": [(2, (1, 80, "disk", 0), _items(2, 1, 40), False), (2, None, _items(2, 41, 40), True)],
    "a batch past the small-batch path": [(0, (1, 100, "memory", 0), _items(0, 1, 100, size=0), True)],
    "an empty last batch": [(4, (7, 9, "memory", 0), [], True)],
    "two snapshots of one partition": [(5, (1, 1, "memory", 0), _items(5, 1, 1), True),
                                       (5, (2, 3, "memory", 0), _items(5, 2, 2), True)],
}


@pytest.mark.parametrize("visits", CASES.values(), ids=CASES.keys())
def test_a_packed_pass_stands_for_its_messages_in_order(visits: Any) -> None:
    data = _as_packed(visits)
    assert is_packed(data)
    packed = decode_frame(data)
    assert type(packed) is PackedPass and len(packed) == len(visits)
    assert [_norm(m) for m in packed.messages()] == [_norm(m) for m in _as_messages(visits)]


def test_layout_is_the_documented_one() -> None:
    frame = encode_binary(3, _items(3, 5, 1), True)
    data = encode_packed([(3, (5, 6, "disk", 2), frame)])
    assert data[:16] == PACKED_MAGIC + bytes([1, 0, 0, 0]) + struct.pack("<II", 1, 0)
    assert SECTION.unpack_from(data, 16) == (3, 1, 1, len(frame), 5, 6, 2)
    assert data[16 + SECTION.size:] == frame
    assert len(data) == HEADER.size + SECTION.size + len(frame)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 63), st.integers(0, 40), st.booleans(), st.sampled_from(["memory", "disk"]),
                          st.integers(0, 50), st.integers(0, 3)), min_size=1, max_size=40))
def test_random_passes_pack_to_the_same_messages(shapes: list[tuple[int, int, bool, str, int, int]]) -> None:
    visits = []
    high: dict[int, int] = {}
    for p, n, with_marker, source, size, deleted_every in shapes:
        start = high.get(p, 0) + 1
        end = start + max(n, 1) - 1
        high[p] = end
        marker = (start, end, source, max(0, start - 3)) if with_marker or p not in high else None
        visits.append((p, marker, _items(p, start, n, deleted_every=deleted_every, size=size), True))
    data = _as_packed(visits)
    assert [_norm(m) for m in decode_packed(data).messages()] == [_norm(m) for m in _as_messages(visits)]
    # inside a bundle, as the server sends it with a pass's control messages after it
    cycle = '{"type":"cycle_complete","cycle":1}'
    bundle = encode_bundle([data, cycle])
    parts = split_bundle(bundle, len(bundle))
    assert sum(n for _, n in parts) == len(bundle)
    first = decode_frame(parts[0][0])
    assert type(first) is PackedPass
    shares = unpacked(first, parts[0][1])
    assert sum(n for _, n in shares) == parts[0][1] and all(n == 0 for _, n in shares[:-1])
    assert decode_frame(parts[1][0]) == M.CycleComplete(1)


def test_pack_messages_refuses_a_marker_without_its_batch() -> None:
    frame = encode_binary(1, _items(1, 1, 1), True)
    marker = ("marker", 1, 1, 1, "memory", 0)
    assert pack_messages([marker, ("batch", 1, frame)]) == [(1, (1, 1, "memory", 0), frame)]
    assert pack_messages([("batch", 1, frame)]) == [(1, None, frame)]
    assert pack_messages([marker]) is None
    assert pack_messages([marker, marker, ("batch", 1, frame)]) is None
    assert pack_messages([marker, ("batch", 2, encode_binary(2, [], True))]) is None


def test_a_shared_reading_packs_only_when_it_is_no_larger_than_its_bundle_parts() -> None:
    frame = encode_binary(1, _items(1, 1, 1), True)
    text = marker_text(1, 1, 1, "memory", 0)
    reading = SharedReading.one_batch(1, 0, 1, (1, 1, 0), 1, encode_parts([text, frame]), len(text) + len(frame))
    assert reading.packed() is None  # no messages given: never packed
    reading = SharedReading.one_batch(1, 0, 1, (1, 1, 0), 1, encode_parts([text, frame]), len(text) + len(frame))
    reading.messages = (("marker", 1, 1, 1, "memory", 0), ("batch", 1, frame))
    data, count = reading.packed()  # type: ignore[misc]
    assert count == 1 and data == section_bytes(1, (1, 1, "memory", 0), frame)
    assert len(data) + PACKED_EXTRA <= len(reading.parts)
    assert reading.packed() == (data, count)  # made once


FRAME = encode_binary(3, _items(3, 5, 2), True)
GOOD = encode_packed([(3, (5, 6, "memory", 0), FRAME)])
S0 = HEADER.size  # offset of the first section


def _patch(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new):]


CORRUPT = {
    "magic": (b"UPRX" + GOOD[4:], "magic"),
    "version": (_patch(GOOD, 4, b"\x02"), "version"),
    "flags": (_patch(GOOD, 5, b"\x01"), "flags"),
    "reserved word": (_patch(GOOD, 6, b"\x01\x00"), "reserved"),
    "no section": (packed_header(1)[:8] + struct.pack("<II", 0, 0), "count"),
    "count past the end": (_patch(GOOD, 8, struct.pack("<I", 2)), "count"),
    "trailing bytes": (GOOD + b"\x00", "length"),
    "batch past the end": (GOOD[:-1], "length"),
    "section flags": (_patch(GOOD, S0 + 2, b"\x03"), "flags"),
    "source": (_patch(GOOD, S0 + 3, b"\x02"), "source"),
    "source without a marker": (_patch(GOOD, S0 + 2, b"\x00\x01"), "source"),
    "marker start after end": (_patch(GOOD, S0 + 8, struct.pack("<Q", 9)), "start"),
    "marker fields without a marker": (_patch(GOOD, S0 + 2, b"\x00"), "start"),
    "batch of another partition": (_patch(GOOD, S0, struct.pack("<H", 4)), "partition"),
    "batch magic": (_patch(GOOD, S0 + SECTION.size, b"UPRX"), "magic"),
    "batch deleted flag": (_patch(GOOD, S0 + SECTION.size + 16 + 24 * 2 + 8 * 2, b"\x02"), "deleted"),
    "batch offsets backwards": (_patch(GOOD, S0 + SECTION.size + 16 + 24 * 2, struct.pack("<II", 9, 8)), "key_ends"),
    "batch count": (_patch(GOOD, S0 + SECTION.size + 8, struct.pack("<I", 3)), "count"),
}


@pytest.mark.parametrize("data, field", CORRUPT.values(), ids=CORRUPT.keys())
def test_every_corruption_is_refused_naming_its_field(data: bytes, field: str) -> None:
    with pytest.raises(ProtocolError) as err:
        decode_packed(data)
    assert err.value.code == ErrorCode.CORRUPT_FRAME and err.value.field == field


def test_hello_asks_for_packed_passes_with_the_binary_codec_and_bundles_only() -> None:
    from engine.protocol.session import ServerSession

    def hello(**kw: Any) -> list[Any]:
        session = ServerSession(node_id="n", partition_count=4)
        return session.receive_text(M.encode(M.Hello("c", **kw)))

    ok = hello(codec=M.Codec.BINARY, bundle=True, frames=M.Frames.PACKED)
    assert not any(isinstance(o, M.Error) for o in ok)
    for kw in ({"codec": M.Codec.JSON, "bundle": True}, {"codec": M.Codec.BINARY, "bundle": False}):
        outs = hello(frames=M.Frames.PACKED, **kw)
        errors = [o for o in outs if isinstance(o, M.Error)]
        assert errors and errors[0].code == ErrorCode.INVALID_FIELD and errors[0].field == "frames"
    assert M.decode_client_message('{"type":"hello","name":"c"}').frames is M.Frames.MESSAGES


def test_a_pass_decodes_the_same_from_bytes_bytearray_and_memoryview() -> None:
    visits = CASES["a tail pass over partitions"] + CASES["several items, deletions"]
    data = _as_packed(visits)
    want = [_norm(m) for m in decode_packed(data).messages()]
    for other in (bytearray(data), memoryview(data)):
        assert [_norm(m) for m in decode_packed(other).messages()] == want
