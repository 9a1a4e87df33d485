"""Item batch codecs: both decode to the same ItemBatch; anything malformed is a ProtocolError."""
from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.protocol.errors import ProtocolError
from engine.protocol.frames import (
    HEADER, ItemBatch, decode_binary, decode_json, encode_binary, encode_json, live_values,
)
from engine.core.types import MAX_SEQNO, Item

ITEMS = [
    Item(b"alpha", 1, 1001, 1, False, b"value-1"),
    Item(b"empty-value", 2, 1002, 3, False, b""),
    Item(b"binary", 3, 1003, 1, False, bytes(range(256))),
    Item(b"gone", 4, 1004, 2, True, b""),
    Item("ключ-✓".encode(), 5, MAX_SEQNO, MAX_SEQNO, False, b"\x00\xff" * 10),
    Item(b"k" * 250, MAX_SEQNO, 0, 0, False, b"z"),
]

CODECS = {
    "binary": (encode_binary, decode_binary),
    "json": (encode_json, decode_json),
}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("last", [True, False])
def test_round_trip_keeps_every_column(codec: str, last: bool) -> None:
    encode, decode = CODECS[codec]
    batch = decode(encode(42, ITEMS, last))
    assert isinstance(batch, ItemBatch)
    assert (batch.partition, batch.last, len(batch)) == (42, last, len(ITEMS))
    assert list(batch.items()) == ITEMS
    assert list(batch.seqnos) == [i.seqno for i in ITEMS]
    assert list(batch.deleted) == [0, 0, 0, 1, 0, 0]
    assert batch.last_seqno == MAX_SEQNO


@pytest.mark.parametrize("codec", CODECS)
def test_empty_batch_round_trips(codec: str) -> None:
    encode, decode = CODECS[codec]
    batch = decode(encode(0, [], True))
    assert len(batch) == 0 and batch.last and batch.keys == [] and batch.last_seqno is None


@pytest.mark.parametrize("codec", CODECS)
def test_large_values_round_trip(codec: str) -> None:
    encode, decode = CODECS[codec]
    big = [Item(b"big", 1, 1, 1, False, b"\xab" * (4 << 20)), Item(b"small", 2, 2, 1, False, b"s")]
    assert list(decode(encode(65535, big, False)).items()) == big


def test_rows_are_plain_tuples_in_item_field_order() -> None:
    batch = decode_binary(encode_binary(1, ITEMS[:2], False))
    assert list(batch.rows()) == [(b"alpha", 1, 1001, 1, 0, b"value-1"), (b"empty-value", 2, 1002, 3, 0, b"")]


def test_binary_frame_is_exactly_header_plus_columns_plus_blobs() -> None:
    frame = encode_binary(7, ITEMS, True)
    keys = sum(len(i.key) for i in ITEMS)
    values = sum(len(i.value) for i in ITEMS)
    assert len(frame) == 16 + 33 * len(ITEMS) + keys + values
    assert HEADER.unpack_from(frame) == (b"UPRB", 1, 1, 7, len(ITEMS), 0)


def test_binary_frame_accepts_memoryview_and_bytearray() -> None:
    frame = encode_binary(1, ITEMS, True)
    assert list(decode_binary(memoryview(frame)).items()) == ITEMS
    assert list(decode_binary(bytearray(frame)).items()) == ITEMS


def test_partition_must_fit_in_u16() -> None:
    with pytest.raises(ValueError):
        encode_binary(65536, ITEMS, True)


# ------------------------------------------------------------------ corrupt binary frames


def test_every_truncation_of_a_frame_is_refused() -> None:
    frame = encode_binary(3, ITEMS[:3], True)
    for cut in range(len(frame)):
        with pytest.raises(ProtocolError) as info:
            decode_binary(frame[:cut])
        assert info.value.code == "corrupt_frame"


def _patch(frame: bytes, offset: int, fmt: str, value: int | bytes) -> bytes:
    out = bytearray(frame)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


FRAME = encode_binary(3, ITEMS[:3], True)
N = 3
KEY_ENDS = 16 + 24 * N
DELETED = 16 + 32 * N

CORRUPT = [
    ("bad magic", _patch(FRAME, 0, "4s", b"XXXX"), "magic"),
    ("unknown version", _patch(FRAME, 4, "<B", 2), "version"),
    ("unknown flag bits", _patch(FRAME, 5, "<B", 0x81), "flags"),
    ("reserved not zero", _patch(FRAME, 12, "<I", 1), "reserved"),
    ("count larger than the frame", _patch(FRAME, 8, "<I", 1000), "count"),
    ("count smaller than the columns", _patch(FRAME, 8, "<I", 2), "length"),
    ("trailing garbage", FRAME + b"\x00", "length"),
    ("deleted flag of 2", _patch(FRAME, DELETED, "<B", 2), "deleted"),
    ("key offsets going backwards", _patch(FRAME, KEY_ENDS, "<I", 20), "key_ends"),
    ("value offsets going backwards", _patch(FRAME, KEY_ENDS + 4 * N, "<I", 100), "value_ends"),
    ("last key offset past the blob", _patch(FRAME, KEY_ENDS + 4 * (N - 1), "<I", 10_000), "length"),
    ("shorter than a header", b"UPRB", "header"),
]


@pytest.mark.parametrize(("case", "frame", "field"), CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt_binary_frame_names_the_bad_part(case: str, frame: bytes, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_binary(frame)
    assert (info.value.code, info.value.field) == ("corrupt_frame", field)


# ------------------------------------------------------------------ corrupt JSON batches


def _json(**changes: object) -> str:
    obj = json.loads(encode_json(3, ITEMS[:2], True))
    obj.update(changes)
    return json.dumps({k: v for k, v in obj.items() if v is not ...})


CORRUPT_JSON = [
    ("column shorter than seqnos", _json(cas=[1]), "corrupt_frame", "cas"),
    ("seqno not an integer", _json(seqnos=[1, "2"]), "corrupt_frame", "seqnos"),
    ("seqno a float", _json(seqnos=[1, 2.0]), "corrupt_frame", "seqnos"),
    ("negative rev", _json(revs=[1, -1]), "corrupt_frame", "revs"),
    ("cas over u64", _json(cas=[1, 1 << 64]), "corrupt_frame", "cas"),
    ("deleted of 2", _json(deleted=[0, 2]), "corrupt_frame", "deleted"),
    ("deleted as booleans", _json(deleted=[False, True]), "corrupt_frame", "deleted"),
    ("key not a string", _json(keys=["a", 5]), "corrupt_frame", "keys"),
    ("value not base64", _json(values=["!!!", ""]), "corrupt_frame", "values"),
    ("partition out of range", _json(partition=70000), "corrupt_frame", "partition"),
    ("last not a boolean", _json(last=1), "corrupt_frame", "last"),
    ("column not a list", _json(keys="ab"), "corrupt_frame", "keys"),
    ("missing column", _json(values=...), "missing_field", "values"),
    ("unknown field", _json(extra=1), "unknown_field", "extra"),
    ("not JSON", "{", "malformed_json", None),
    ("nested too deeply", "[" * 100_000, "malformed_json", None),
]


@pytest.mark.parametrize(("case", "text", "code", "field"), CORRUPT_JSON, ids=[c[0] for c in CORRUPT_JSON])
def test_corrupt_json_batch_names_the_bad_column(case: str, text: str, code: str, field: str | None) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_json(text)
    assert (info.value.code, info.value.field) == (code, field)


def test_json_batch_text_is_ascii() -> None:
    text = encode_json(1, ITEMS, False)
    assert len(text) == len(text.encode("utf-8"))


# ------------------------------------------------------------------ property: any batch round-trips

items_strategy = st.lists(
    st.builds(
        Item,
        key=st.text(min_size=1, max_size=20).map(lambda s: s.encode("utf-8", "surrogatepass")),
        seqno=st.integers(0, MAX_SEQNO),
        cas=st.integers(0, MAX_SEQNO),
        rev=st.integers(0, MAX_SEQNO),
        deleted=st.booleans(),
        value=st.binary(max_size=64),
    ),
    max_size=30,
)


@settings(max_examples=60)
@given(st.integers(0, 65535), items_strategy, st.booleans())
def test_any_batch_round_trips_through_the_binary_codec(partition: int, items: list[Item], last: bool) -> None:
    batch = decode_binary(encode_binary(partition, items, last))
    assert (batch.partition, batch.last, list(batch.items())) == (partition, last, items)


@settings(max_examples=60)
@given(st.integers(0, 65535), items_strategy.map(lambda xs: [i for i in xs if _utf8(i.key)]), st.booleans())
def test_any_batch_round_trips_through_the_json_codec(partition: int, items: list[Item], last: bool) -> None:
    batch = decode_json(encode_json(partition, items, last))
    assert (batch.partition, batch.last, list(batch.items())) == (partition, last, items)


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# ------------------------------------------------------------------ live_values: the values alone, checked the same


@pytest.mark.parametrize(("case", "frame", "field"), CORRUPT, ids=[c[0] for c in CORRUPT])
def test_live_values_refuses_what_decode_binary_refuses(case: str, frame: bytes, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        live_values(frame)
    assert (info.value.code, info.value.field) == ("corrupt_frame", field)


def test_live_values_refuses_every_truncation() -> None:
    for cut in range(len(FRAME)):
        with pytest.raises(ProtocolError):
            live_values(FRAME[:cut])


@settings(max_examples=60)
@given(st.integers(0, 65535), items_strategy, st.booleans())
def test_live_values_are_the_values_of_the_items_not_deleted(partition: int, items: list[Item], last: bool) -> None:
    frame = encode_binary(partition, items, last)
    expected = [i.value for i in items if not i.deleted]
    assert live_values(frame) == expected
    assert live_values(memoryview(b"xx" + frame)[2:]) == expected


def _reference_binary(partition: int, items: list[Item], last: bool) -> bytes:
    """The binary frame's layout written out field by field (little-endian, as specified)."""
    from itertools import accumulate
    n = len(items)
    out = [b"UPRB", bytes([1, 1 if last else 0]), struct.pack("<HII", partition, n, 0)]
    for column in ("seqno", "cas", "rev"):
        out.append(struct.pack(f"<{n}Q", *(getattr(i, column) for i in items)))
    out.append(struct.pack(f"<{n}I", *accumulate(len(i.key) for i in items)))
    out.append(struct.pack(f"<{n}I", *accumulate(len(i.value) for i in items)))
    out.append(bytes(int(i.deleted) for i in items))
    out += [i.key for i in items] + [i.value for i in items]
    return b"".join(out)


@pytest.mark.parametrize("n", [1, 2, 3, 31, 32, 33, 64])
def test_small_and_large_batches_make_the_layouts_bytes(n: int) -> None:
    """Batches of up to 32 items pack their columns in one call, larger ones through arrays:
    both make exactly the specified layout."""
    items = [ITEMS[i % len(ITEMS)]._replace(seqno=i + 1) for i in range(n)]
    assert encode_binary(7, items, n % 2 == 0) == _reference_binary(7, items, n % 2 == 0)


def test_a_small_batch_out_of_range_fails_as_a_large_one() -> None:
    with pytest.raises(OverflowError):
        encode_binary(1, [Item(b"k", -1, 1, 1, False, b"v")], True)
