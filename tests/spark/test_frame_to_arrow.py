"""The Spark task's zero-copy path from a binary item frame to Arrow checks the frame header as
every other decoder does (``frames.ITEM_BATCH``) and agrees with ``decode_binary`` on good frames."""
from __future__ import annotations

import struct

import pytest

from engine.core.types import Item
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.frames import decode_binary, encode_binary
from spark_connector.task import batch_to_arrow, frame_to_arrow

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
