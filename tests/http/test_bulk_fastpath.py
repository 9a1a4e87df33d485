"""``bulk.decode`` has one parsing path with a typed pass in front: for any body, the typed pass
(``plain_sets``) must build exactly the operations the per-item path (``parse_items`` and
``to_op``) builds, or decline the body and leave it to that path, for every shape of item."""
from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import bulk
from app.problems import Problem
from engine.core.types import Op, WriteOp, WriteResult


class _Recorder:
    def __init__(self) -> None:
        self.ops: list[WriteOp] = []

    def write_batch(self, ops):  # type: ignore[no-untyped-def]
        self.ops = list(ops)
        return [WriteResult(key, 0, i + 1, 7, 1, kind is Op.DELETION) for i, (kind, key, _v, _c) in enumerate(ops)]


ITEMS = [
    {"op": "set", "key": "a", "value": {"x": [1, 2.5, None, "é"]}},
    {"op": "set", "key": "b", "value": None},
    {"op": "set", "key": "c", "value_b64": base64.b64encode(b"\x00\xff\x10").decode()},
    {"op": "set", "key": "d", "value_b64": ""},
    {"op": "set", "key": "e", "value_b64": "***"},
    {"op": "set", "key": "f", "value_b64": "QQ"},          # missing padding
    {"op": "set", "key": "g", "value_b64": "QQ==QQ=="},    # data after padding
    {"op": "set", "key": "h", "value_b64": "QUFB\n"},      # whitespace
    {"op": "set", "key": "i", "value_b64": "QUFCéé"},      # not ASCII
    {"op": "set", "key": "j", "value_b64": 5},
    {"op": "set", "key": 5, "value": 1},
    {"op": "set", "key": "k", "cas": 9},
    {"op": "set", "key": "l", "value": 1, "cas": 9},
    {"op": "set", "key": "m", "value": 1, "value_b64": "AA=="},
    {"op": "set", "key": "n", "bogus": 1},
    {"op": "delete", "key": "o"},
    {"op": "delete", "key": "p", "value": 1},
    {"op": "nope", "key": "q", "value": 1},
    {"op": "set", "value": 1, "other": 2},
    ["not", "an", "object"],
]
#: the shapes the typed pass takes (every other one must be declined)
PLAIN = {0, 1, 2, 3}


def _body(items: list[object], ndjson: bool) -> bytes:
    return b"\n".join(map(orjson.dumps, items)) + b"\n" if ndjson else orjson.dumps(items)


def _per_item(body: bytes, ndjson: bool) -> bulk.Batch:
    return bulk.batch_of(bulk.parse_items(body, ndjson, 100))


@pytest.mark.parametrize("ndjson", [False, True])
@pytest.mark.parametrize("index", range(len(ITEMS)))
def test_each_item_shape_gets_what_to_op_gives(index: int, ndjson: bool) -> None:
    item = ITEMS[index]
    expected = bulk.to_op(0, item)
    batch = bulk.decode(_body([item], ndjson), ndjson, 100)
    assert (bulk.plain_sets(_body([item], ndjson), ndjson) is not None) == (index in PLAIN)
    body, _targets = bulk.apply(_Recorder(), batch, "memory")
    result = body["results"][0]
    if isinstance(expected, WriteOp):
        assert batch.ops == [expected] and batch.refused == {}
        assert result["status"] == 200
    else:
        assert batch.ops == []
        assert result == {"index": 0, "status": expected.status, "error": expected.body()}


@pytest.mark.parametrize("ndjson", [False, True])
@pytest.mark.parametrize("index", range(len(ITEMS)))
def test_typed_pass_builds_what_the_per_item_path_builds_or_declines(index: int, ndjson: bool) -> None:
    """A body of one item shape: the typed pass gives exactly the per-item path's operations, or
    declines; either way ``decode`` answers as the per-item path does."""
    body = _body([ITEMS[index]] * 3, ndjson)
    per_item = _per_item(body, ndjson)
    batch = bulk.decode(body, ndjson, 100)
    assert batch.size == 3
    assert batch.ops == per_item.ops and list(batch.slots) == list(per_item.slots)
    assert batch.refused == per_item.refused
    plain = bulk.plain_sets(body, ndjson)
    if index in PLAIN:
        assert plain is not None
        assert [WriteOp(Op.MUTATION, k, v, None) for k, v in zip(*plain)] == per_item.ops
    else:
        assert plain is None
        assert len(per_item.refused) == 3 or all(type(op) is WriteOp for op in per_item.ops)


@pytest.mark.parametrize("ndjson", [False, True])
@pytest.mark.parametrize("other", [i for i in range(len(ITEMS)) if i not in PLAIN] + [2])
def test_one_other_item_sends_the_body_item_by_item(other: int, ndjson: bool) -> None:
    """A value body with one item of another shape (a value_b64 one included) is not "plain"."""
    body = _body([ITEMS[0], ITEMS[other], ITEMS[1]], ndjson)
    assert bulk.plain_sets(body, ndjson) is None
    batch = bulk.decode(body, ndjson, 100)
    assert batch == _per_item(body, ndjson)
    result, _targets = bulk.apply(_Recorder(), batch, "memory")
    assert [r["index"] for r in result["results"]] == [0, 1, 2]


def test_plain_sets_of_value_b64() -> None:
    assert bulk.plain_sets(_body([ITEMS[2], ITEMS[3], ITEMS[2]], False), False) == (
        ["c", "d", "c"], [b"\x00\xff\x10", b"", b"\x00\xff\x10"])
    assert bulk.plain_sets(_body([ITEMS[2], ITEMS[4]], False), False) is None  # one bad base64 value
    assert bulk.plain_sets(b"[]", False) is None or bulk.plain_sets(b"[]", False) == ([], [])


def test_a_whole_item_that_is_wrong_is_named_by_its_index() -> None:
    """``[[null, null]]``: the item itself is the culprit, at field ``[0]`` (not ``[0].``)."""
    batch = bulk.decode(b"[[null, null]]", False, 100)
    assert batch.ops == []
    assert batch.refused[0]["error"]["field"] == "[0]"
    assert bulk.decode(b'[{"op":"set","key":"a","value":1,"x":2}]', False, 100).refused[0]["error"]["field"] == "[0]"
    assert bulk.decode(b'[{"op":"set","key":7,"value":1}]', False, 100).refused[0]["error"]["field"] == "[0].key"


# ------------------------------------------------------------------ values stored as sent
_SPACED = b'{ "n" : [1,  2.50, "\\u00e9"] }'  # whitespace, a trailing zero and an escape, kept as sent


def _ops_of(body: bytes, ndjson: bool) -> list[tuple]:
    recorder = _Recorder()
    result, _targets = bulk.apply(recorder, bulk.decode(body, ndjson, 100), "memory", columns=True)
    assert result["failed"] == len(result["errors"])
    return [tuple(op) for op in recorder.ops]


@pytest.mark.parametrize("ndjson", [False, True])
def test_value_is_stored_as_its_text_as_sent(ndjson: bool) -> None:
    """The stored value is the client's text of it, byte for byte: valid JSON of the same value
    (not re-encoded to compact form), on the typed pass and on the per-item path."""
    items = [b'{"op":"set","key":"a","value":' + _SPACED + b'}', b'{"op": "set", "key": "b", "value": "x" }']
    body = b"\n".join(items) + b"\n" if ndjson else b"[" + b" ,\n ".join(items) + b"]"
    assert bulk.plain_sets(body, ndjson) is not None
    expected = [(Op.MUTATION, "a", _SPACED, None), (Op.MUTATION, "b", b'"x"', None)]
    assert _ops_of(body, ndjson) == expected
    assert orjson.loads(_SPACED) == {"n": [1, 2.5, "é"]}
    # one item with a cas (or any other shape) takes the per-item path: same stored text
    items.append(b'{"op":"set","key":"c","value": [ 1 ] ,"cas":null}')
    body = b"\n".join(items) if ndjson else b"[" + b",".join(items) + b"]"
    assert bulk.plain_sets(body, ndjson) is None
    assert _ops_of(body, ndjson) == [*expected, (Op.MUTATION, "c", b"[ 1 ]", None)]


def test_per_item_path_with_non_object_items_keeps_value_texts() -> None:
    body = b'[{"op":"set","key":"a","value": {"z" :1}}, 7, {"op":"delete","key":"b"}]'
    assert _ops_of(body, False) == [(Op.MUTATION, "a", b'{"z" :1}', None), (Op.DELETION, "b", b"", None)]


@pytest.mark.parametrize("ndjson", [False, True])
def test_invalid_utf8_in_a_value_is_refused(ndjson: bool) -> None:
    """msgspec does not check the UTF-8 of a Raw value; the typed pass declines and the per-item
    path refuses the body (array) or that line (NDJSON)."""
    line = b'{"op":"set","key":"a","value":"\xff"}'
    if ndjson:
        body = line + b"\n" + b'{"op":"set","key":"b","value":1}'
        assert bulk.plain_sets(body, True) is None
        batch = bulk.decode(body, True, 100)
        assert batch.refused[0]["error"]["field"] == "line 1"
        assert [op[1] for op in batch.ops] == ["b"]
    else:
        with pytest.raises(Problem) as info:
            bulk.decode(b"[" + line + b"]", False, 100)
        assert info.value.status == 422


def test_ndjson_line_must_stand_alone() -> None:
    """Two items on one line, or one item over two lines, are errors of those lines (msgspec's
    decode_lines would accept both, so the typed pass decodes line by line)."""
    body = (b'{"op":"set","key":"a","value":1} {"op":"set","key":"b","value":2}\n'
            b'{"op":"set","key":"c",\n"value":3}\n{"op":"set","key":"d","value":4}\n')
    items = bulk.parse_items(body, True, 100)
    assert [type(i) for i in items] == [Problem, Problem, Problem, dict]
    assert [i.field for i in items[:3]] == ["line 1", "line 2", "line 3"]
    batch = bulk.decode(body, True, 100)
    assert sorted(batch.refused) == [0, 1, 2] and [op[1] for op in batch.ops] == ["d"]


@pytest.mark.parametrize("ndjson", [False, True])
def test_plain_batch_over_the_item_limit(ndjson: bool) -> None:
    items = [b'{"op":"set","key":"k%d","value":1}' % i for i in range(4)]
    body = b"\n".join(items) if ndjson else b"[" + b",".join(items) + b"]"
    with pytest.raises(Problem) as info:
        bulk.decode(body, ndjson, 3)
    assert info.value.status == 413
    assert bulk.plain_sets(body, ndjson) is not None
    assert bulk.decode(body, ndjson, 4).size == 4


_B64_CASES = ["", "00000000=", "QUFC", "QR==", "QQ", "QQ=", "QQ===", "Q===", "QQ==QQ==", "QUFB\n", "QUFC\r\n", " QUFC", "QU FC",
              "QUFC-_", "QUFCéé", "***", base64.b64encode(bytes(range(256))).decode()]


@pytest.mark.parametrize("text", _B64_CASES)
def test_value_b64_decodes_as_to_op_on_either_path(text: str) -> None:
    """Whichever path a ``value_b64`` body takes, each item gets exactly what ``to_op``
    (``b64decode(validate=True)``) gives: the same bytes, or ``to_op``'s error.  (msgspec's base64
    in the typed pass refuses a few texts Python accepts, e.g. ``"00000000="`` with excess
    padding: those bodies take the per-item path and are merely slower.)"""
    item = {"op": "set", "key": "k", "value_b64": text}
    expected = bulk.to_op(0, item)
    items = [item, {**item, "key": "k2"}]
    for ndjson in (False, True):
        batch = bulk.decode(_body(items, ndjson), ndjson, 10)
        if isinstance(expected, WriteOp):
            assert batch.ops == [expected, expected._replace(key="k2")] and batch.refused == {}
        else:
            assert batch.ops == []
            assert batch.refused[0] == {"index": 0, "status": expected.status, "error": expected.body()}
            assert batch.refused[1]["status"] == expected.status


@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n", max_size=24))
def test_msgspec_base64_matches_b64decode_validate(text: str) -> None:
    test_value_b64_decodes_as_to_op_on_either_path(text)
