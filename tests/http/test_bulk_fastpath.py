"""``bulk.apply``'s inline fast path must build exactly what ``bulk.to_op`` builds (or send the
item to ``to_op`` for its error), for every shape of item."""
from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import bulk
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


@pytest.mark.parametrize("index", range(len(ITEMS)))
def test_fast_path_matches_to_op(index: int) -> None:
    item = ITEMS[index]
    expected = bulk.to_op(0, item)
    recorder = _Recorder()
    body, _targets = bulk.apply(recorder, [item], "memory")
    result = body["results"][0]
    if isinstance(expected, WriteOp):
        assert recorder.ops == [expected]
        # a WriteOp, or from plain_sets the same plain (op, key, value, cas) tuple (Engine.write_batch takes both)
        assert type(recorder.ops[0]) is (tuple if bulk.plain_sets([item]) is not None else WriteOp)
        assert result["status"] == 200
    else:
        assert recorder.ops == []
        assert result == {"index": 0, "status": expected.status, "error": expected.body()}


@pytest.mark.parametrize("index", range(len(ITEMS)))
def test_plain_sets_builds_what_to_op_builds_or_declines(index: int) -> None:
    """A batch of one item shape: the whole-batch path (``plain_sets``) gives exactly the operations
    ``to_op`` gives, or declines the batch (then the per-item path answers, as above)."""
    items = [ITEMS[index]] * 3
    plain = bulk.plain_sets(items)
    expected = [bulk.to_op(i, item) for i, item in enumerate(items)]
    if plain is None:
        return
    assert all(type(op) is WriteOp for op in expected)
    keys, values = plain
    assert [WriteOp(Op.MUTATION, k, v, None) for k, v in zip(keys, values)] == expected
    recorder = _Recorder()
    body, _targets = bulk.apply(recorder, items, "memory")
    assert recorder.ops == expected  # plain (op, key, value, cas) tuples, equal to the WriteOps
    assert [r["status"] for r in body["results"]] == [200, 200, 200]


@pytest.mark.parametrize("other", [i for i in range(len(ITEMS)) if bulk.plain_sets([ITEMS[i]]) is None] + [2])
def test_one_other_item_sends_the_batch_item_by_item(other: int) -> None:
    """A value batch with one item of another shape (a value_b64 one included) is not "plain"."""
    items = [ITEMS[0], ITEMS[other], ITEMS[1]]
    assert bulk.plain_sets(items) is None
    recorder = _Recorder()
    body, _targets = bulk.apply(recorder, items, "memory")
    assert [r["index"] for r in body["results"]] == [0, 1, 2]


def test_plain_sets_of_value_b64() -> None:
    items = [ITEMS[2], ITEMS[3], ITEMS[2]]
    assert bulk.plain_sets(items) == (["c", "d", "c"], [b"\x00\xff\x10", b"", b"\x00\xff\x10"])
    assert bulk.plain_sets([ITEMS[2], ITEMS[4]]) is None  # one bad base64 value
    assert bulk.plain_sets([]) is None


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
    (not re-encoded to compact form), on the plain path and on the general one."""
    import orjson

    items = [b'{"op":"set","key":"a","value":' + _SPACED + b'}', b'{"op": "set", "key": "b", "value": "x" }']
    body = b"\n".join(items) + b"\n" if ndjson else b"[" + b" ,\n ".join(items) + b"]"
    assert type(bulk.decode(body, ndjson, 100)) is bulk.PlainSets
    expected = [(Op.MUTATION, "a", _SPACED, None), (Op.MUTATION, "b", b'"x"', None)]
    assert _ops_of(body, ndjson) == expected
    assert orjson.loads(_SPACED) == {"n": [1, 2.5, "é"]}
    # one item with a cas (or any other shape) takes the general path: same stored text
    items.append(b'{"op":"set","key":"c","value": [ 1 ] ,"cas":null}')
    body = b"\n".join(items) if ndjson else b"[" + b",".join(items) + b"]"
    assert type(bulk.decode(body, ndjson, 100)) is list
    assert _ops_of(body, ndjson) == [*expected, (Op.MUTATION, "c", b"[ 1 ]", None)]


def test_general_path_with_non_object_items_keeps_value_texts() -> None:
    body = b'[{"op":"set","key":"a","value": {"z" :1}}, 7, {"op":"delete","key":"b"}]'
    assert _ops_of(body, False) == [(Op.MUTATION, "a", b'{"z" :1}', None), (Op.DELETION, "b", b"", None)]


@pytest.mark.parametrize("ndjson", [False, True])
def test_invalid_utf8_in_a_value_is_refused(ndjson: bool) -> None:
    """msgspec does not check the UTF-8 of a Raw value; the plain path declines and the general
    path refuses the body (array) or that line (NDJSON), as before."""
    from app.problems import Problem

    line = b'{"op":"set","key":"a","value":"\xff"}'
    if ndjson:
        items = bulk.decode(line + b"\n" + b'{"op":"set","key":"b","value":1}', True, 100)
        assert isinstance(items[0], Problem) and items[0].field == "line 1"
    else:
        with pytest.raises(Problem) as info:
            bulk.decode(b"[" + line + b"]", False, 100)
        assert info.value.status == 422


def test_ndjson_line_must_stand_alone() -> None:
    """Two items on one line, or one item over two lines, are errors of those lines (msgspec's
    decode_lines would accept both, so the plain path decodes line by line)."""
    from app.problems import Problem

    body = (b'{"op":"set","key":"a","value":1} {"op":"set","key":"b","value":2}\n'
            b'{"op":"set","key":"c",\n"value":3}\n{"op":"set","key":"d","value":4}\n')
    items = bulk.decode(body, True, 100)
    assert [type(i) for i in items] == [Problem, Problem, Problem, dict]
    assert [i.field for i in items[:3]] == ["line 1", "line 2", "line 3"]


@pytest.mark.parametrize("ndjson", [False, True])
def test_plain_batch_over_the_item_limit(ndjson: bool) -> None:
    from app.problems import Problem

    items = [b'{"op":"set","key":"k%d","value":1}' % i for i in range(4)]
    body = b"\n".join(items) if ndjson else b"[" + b",".join(items) + b"]"
    with pytest.raises(Problem) as info:
        bulk.decode(body, ndjson, 3)
    assert info.value.status == 413
    assert type(bulk.decode(body, ndjson, 4)) is bulk.PlainSets


_B64_CASES = ["", "00000000=", "QUFC", "QR==", "QQ", "QQ=", "QQ===", "Q===", "QQ==QQ==", "QUFB\n", "QUFC\r\n", " QUFC", "QU FC",
              "QUFC-_", "QUFCéé", "***", base64.b64encode(bytes(range(256))).decode()]


@pytest.mark.parametrize("text", _B64_CASES)
def test_plain_value_b64_batch_decodes_as_to_op(text: str) -> None:
    """What msgspec's base64 (the plain ``value_b64`` path) accepts, it decodes to exactly what
    ``b64decode(validate=True)`` (``to_op``) yields, and it never accepts what ``to_op`` refuses.
    When it refuses, the batch takes the general path, so ``to_op`` decides: either the same value
    or ``to_op``'s error.  (msgspec refuses a few texts Python accepts, e.g. ``"00000000="`` with
    excess padding: those batches are merely slower.)"""
    import orjson

    item = {"op": "set", "key": "k", "value_b64": text}
    expected = bulk.to_op(0, item)
    items = [item, {**item, "key": "k2"}]
    for decoded in (bulk.decode(orjson.dumps(items), False, 10),
                    bulk.decode(b"\n".join(map(orjson.dumps, items)) + b"\n", True, 10)):
        if isinstance(expected, WriteOp):
            assert type(decoded) is list or decoded == bulk.PlainSets(["k", "k2"], [expected.value] * 2)
        else:
            assert type(decoded) is list


@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n", max_size=24))
def test_msgspec_base64_matches_b64decode_validate(text: str) -> None:
    test_plain_value_b64_batch_decodes_as_to_op(text)
