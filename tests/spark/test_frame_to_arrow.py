"""The Spark task's zero-copy path from a binary item frame to Arrow checks the frame header as
every other decoder does (``frames.ITEM_BATCH``) and agrees with ``decode_binary`` on good frames."""
from __future__ import annotations

import struct

import pytest

from engine.core.types import Item
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.frames import decode_binary, encode_binary
from spark_connector.task import batch_to_arrow, coalesce, frame_to_arrow

ITEMS = [
    Item(b"alpha", 5, 105, 1, False, b"v1"),
    Item(b"gone", 6, 106, 2, True, b""),
    Item("ключ".encode(), 9, 109, 1, False, b"\xff"),
]
FRAME = encode_binary(3, ITEMS, True)


def _patch(offset: int, fmt: str, value: object) -> bytes:
    new = struct.pack(fmt, value)
    return FRAME[:offset] + new + FRAME[offset + len(new):]


@pytest.mark.parametrize(("frame", "field"), [
    (FRAME[:15], "header"),
    (_patch(0, "4s", b"UPRM"), "magic"),
    (_patch(4, "<B", 2), "version"),
    (_patch(5, "<B", 0x03), "flags"),
    (_patch(12, "<I", 9), "reserved"),
    (_patch(8, "<I", 1000), "count"),
    (FRAME + b"\x00", "length"),
], ids=["short", "magic", "version", "flags", "reserved", "count", "length"])
def test_corrupt_frame_is_refused_like_decode_binary(frame: bytes, field: str) -> None:
    with pytest.raises(ProtocolError) as fast:
        frame_to_arrow(frame, {3: (0, 9)})
    with pytest.raises(ProtocolError) as reference:
        decode_binary(frame)
    assert (fast.value.code, fast.value.field) == (reference.value.code, reference.value.field) == (
        ErrorCode.CORRUPT_FRAME, field)


def test_good_frame_gives_the_rows_decode_binary_gives() -> None:
    snaps = {3: (0, 9)}
    assert frame_to_arrow(FRAME, snaps).to_pylist() == batch_to_arrow(decode_binary(FRAME), snaps[3]).to_pylist()


def _frames(sizes: list[int], value_bytes: int) -> list:
    seqno = 0
    out = []
    for n in sizes:
        items = [Item(f"k{seqno + i}".encode(), seqno + i + 1, 1, 1, False, b"v" * value_bytes) for i in range(n)]
        seqno += n
        out.append(frame_to_arrow(encode_binary(3, items, True), {3: (0, seqno)}))
    return out


@pytest.mark.parametrize(("sizes", "value_bytes", "rows", "max_bytes"), [
    ([10] * 50, 10, 64, 1 << 30),          # small frames merged by the row count
    ([10] * 50, 1000, 1000, 20_000),       # the byte cap ends batches first
    ([300], 1000, 1000, 20_000),           # one frame larger than the cap is cut to fit
    ([3, 1, 4], 50_000, 1000, 20_000),     # a row larger than the cap goes alone
])
def test_coalesce_keeps_every_row_in_order_and_batches_within_the_cap(sizes, value_bytes, rows, max_bytes) -> None:
    frames = _frames(sizes, value_bytes)
    out = list(coalesce(iter(frames), rows, max_bytes))
    assert [r for b in out for r in b.to_pylist()] == [r for f in frames for r in f.to_pylist()]
    assert all(b.num_rows == 1 or b.nbytes <= max_bytes for b in out)
    assert all(b.num_rows < rows + max(sizes) for b in out)
    if max_bytes == 1 << 30:
        assert len(out) == -(-sum(sizes) // 70)     # frames of 10 rows up to >= 64 rows: 70 per batch
