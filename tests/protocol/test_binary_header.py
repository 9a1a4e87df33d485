"""Both binary messages (item batch frames, bundles) start with one header, checked in one place:
a corrupt header is refused naming the same field by every decoder."""
from __future__ import annotations

import struct

import pytest

from engine.core.types import Item
from engine.protocol.binary_header import HEADER, BinaryFormat
from engine.protocol.bundle import BUNDLE, decode_bundle, encode_bundle, is_bundle
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.frames import ITEM_BATCH, decode_binary, encode_binary

BATCH = encode_binary(7, [Item(b"k", 1, 11, 1, False, b"v")], True)
BUNDLED = encode_bundle(['{"type":"cycle_complete","cycle":1}', BATCH])


def _patch(data: bytes, offset: int, fmt: str, value: object) -> bytes:
    new = struct.pack(fmt, value)
    return data[:offset] + new + data[offset + len(new):]


# (case, corruption of a good message, the field the error names)
HEADER_FAULTS = [
    ("shorter than the header", lambda d: d[:HEADER.size - 1], "header"),
    ("empty", lambda d: b"", "header"),
    ("other magic", lambda d: _patch(d, 0, "4s", b"UPRX"), "magic"),
    ("next version", lambda d: _patch(d, 4, "<B", d[4] + 1), "version"),
    ("undefined flag bit", lambda d: _patch(d, 5, "<B", d[5] | 0x80), "flags"),
    ("reserved u32 set", lambda d: _patch(d, 12, "<I", 1), "reserved"),
]
DECODERS = {"item batch": (BATCH, decode_binary), "bundle": (BUNDLED, decode_bundle)}


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize(("case", "corrupt", "field"), HEADER_FAULTS, ids=[c[0] for c in HEADER_FAULTS])
def test_every_decoder_refuses_a_corrupt_header_naming_the_field(decoder: str, case: str, corrupt, field: str) -> None:
    good, decode = DECODERS[decoder]
    with pytest.raises(ProtocolError) as info:
        decode(corrupt(good))
    assert (info.value.code, info.value.field) == (ErrorCode.CORRUPT_FRAME, field)
    assert info.value.message.startswith(f"corrupt {decoder}: {field}: ")


@pytest.mark.parametrize("fmt", [ITEM_BATCH, BUNDLE], ids=lambda f: f.name)
def test_check_header_returns_flags_word_and_count(fmt: BinaryFormat) -> None:
    data = fmt.pack_header(fmt.flags, 0 if fmt is BUNDLE else 513, 3) + b"rest is not the header's business"
    assert fmt.check_header(data) == (fmt.flags, 0 if fmt is BUNDLE else 513, 3)
    assert fmt.check_header(memoryview(data)) == fmt.check_header(bytearray(data))


def test_the_magic_tells_the_two_binary_messages_apart() -> None:
    assert is_bundle(BUNDLED) and BUNDLE.matches(BUNDLED) and not ITEM_BATCH.matches(BUNDLED)
    assert ITEM_BATCH.matches(BATCH) and not is_bundle(BATCH)
    assert ITEM_BATCH.magic != BUNDLE.magic and len(ITEM_BATCH.magic) == len(BUNDLE.magic) == 4


def test_both_formats_use_the_documented_layout() -> None:
    assert HEADER.size == 16
    assert BATCH[:16] == b"UPRB" + bytes([1, 1]) + struct.pack("<HII", 7, 1, 0)
    assert BUNDLED[:16] == b"UPRM" + bytes([1, 0]) + struct.pack("<HII", 0, 2, 0)
