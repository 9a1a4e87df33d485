"""``app.bulk``, table-driven: item validation, NDJSON detection, whole-body errors, and
``apply``'s per-item outcomes in both result forms (objects and columns)."""
from __future__ import annotations

import base64
import json

import orjson
import pytest

from app import bulk
from app.problems import Problem
from engine.core import errors as E
from engine.core.types import Op, WriteOp


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"op": "set", "key": "a", "value": {"x": 1}}, WriteOp(Op.MUTATION, "a", b'{"x":1}')),
        ({"op": "set", "key": "a", "value": "s"}, WriteOp(Op.MUTATION, "a", b'"s"')),
        ({"op": "set", "key": "a", "value": None}, WriteOp(Op.MUTATION, "a", b"null")),
        ({"op": "set", "key": "a", "value_b64": base64.b64encode(b"\x00\xff").decode()},
         WriteOp(Op.MUTATION, "a", b"\x00\xff")),
        ({"op": "set", "key": "a", "value": 1, "cas": 7}, WriteOp(Op.MUTATION, "a", b"1", 7)),
        ({"op": "delete", "key": "a"}, WriteOp(Op.DELETION, "a", b"")),
        ({"op": "delete", "key": "a", "cas": 3}, WriteOp(Op.DELETION, "a", b"", 3)),
    ],
)
def test_valid_items(item: dict, expected: WriteOp) -> None:
    assert bulk.to_op(0, item) == expected


@pytest.mark.parametrize(
    ("item", "field", "words"),
    [
        ([1, 2], "[4]", "must be an object"),
        ({"op": "set", "key": "a"}, "[4].value", "needs value or value_b64"),
        ({"op": "set", "key": "a", "value": 1, "value_b64": "AA=="}, "[4].value_b64", "not both"),
        ({"op": "set", "key": "a", "value_b64": "***"}, "[4].value_b64", "not valid base64"),
        ({"op": "set", "key": "a", "value_b64": 5}, "[4].value_b64", "base64 string"),
        ({"op": "set", "key": 5, "value": 1}, "[4].key", "key must be a string"),
        ({"op": "upsert", "key": "a", "value": 1}, "[4].op", 'op must be "set" or "delete"'),
        ({"key": "a", "value": 1}, "[4].op", "op must be"),
        ({"op": "delete", "key": "a", "value": 1}, "[4].value", "delete takes no value"),
        ({"op": "set", "key": "a", "value": 1, "cas": -1}, "[4].cas", "unsigned 64-bit"),
        ({"op": "set", "key": "a", "value": 1, "cas": "12"}, "[4].cas", "unsigned 64-bit"),
        ({"op": "set", "key": "a", "value": 1, "cas": True}, "[4].cas", "unsigned 64-bit"),
        ({"op": "set", "key": "a", "value": 1, "cas": 1 << 64}, "[4].cas", "unsigned 64-bit"),
        ({"op": "set", "key": "a", "value": 1, "ttl": 3}, "[4]", "unknown field(s) ttl"),
    ],
)
def test_invalid_items(item: object, field: str, words: str) -> None:
    problem = bulk.to_op(4, item)
    assert isinstance(problem, Problem)
    assert problem.status == 422
    assert problem.field == field
    assert words in problem.detail


@pytest.mark.parametrize(
    ("content_type", "body", "ndjson"),
    [
        ("application/x-ndjson", b"[1]", True),
        ("application/jsonl", b"{}", True),
        ("application/json", b"{}\n{}", False),
        (None, b"  [ {} ]", False),
        (None, b'{"op":"set"}\n', True),
        ("application/octet-stream", b"[]", False),
        ("text/plain", b"{}", True),
    ],
)
def test_ndjson_detection(content_type: str | None, body: bytes, ndjson: bool) -> None:
    assert bulk.is_ndjson(content_type, body) is ndjson


def test_ndjson_bad_line_is_its_own_error() -> None:
    items = bulk.parse_items(b'{"a":1}\n\n{oops\r\n{"b":2}\r\n', ndjson=True, max_items=10)
    assert items[0] == {"a": 1} and items[2] == {"b": 2}
    assert isinstance(items[1], Problem) and items[1].field == "line 3"


@pytest.mark.parametrize(
    ("body", "ndjson", "status"),
    [(b"[1,", False, 422), (b'{"a":1}', False, 422), (b"[" + b"{}," * 3 + b"{}]", False, 413),
     (b"{}\n" * 5, True, 413)],
)
def test_whole_body_errors(body: bytes, ndjson: bool, status: int) -> None:
    with pytest.raises(Problem) as info:
        bulk.parse_items(body, ndjson, max_items=3)
    assert info.value.status == status


class _FakeBatchWriter:
    """Only for the pure ``apply`` bookkeeping; real engine behaviour is tested end to end."""

    def write_batch(self, ops):  # type: ignore[no-untyped-def]
        from engine.core.types import WriteResult

        out = []
        for i, (kind, key, _value, _cas) in enumerate(ops):  # WriteOps or plain tuples, as the engine takes
            if key == "bad":
                out.append(E.CasMismatch("nope", expected=1, actual=2, field="cas", partition=0))
            else:
                out.append(WriteResult(key, len(key) % 2, 10 + i, 99, 1, kind is Op.DELETION))
        return out


def test_apply_keeps_order_and_targets_highest_seqno_per_partition() -> None:
    items = [{"op": "set", "key": "a", "value": 1}, {"op": "nope"}, {"op": "set", "key": "bad", "value": 1, "cas": 1},
             {"op": "delete", "key": "cc"}, {"op": "set", "key": "e", "value": 2}]
    body, targets = bulk.apply(_FakeBatchWriter(), bulk.batch_of(items), "persist")
    assert [r["status"] for r in body["results"]] == [200, 422, 409, 200, 200]
    assert [r["index"] for r in body["results"]] == [0, 1, 2, 3, 4]
    assert body["succeeded"] == 3 and body["failed"] == 2
    assert body["results"][2]["error"]["type"].endswith("/cas-mismatch")
    assert targets == {1: 13, 0: 12}
    orjson.dumps(body)


@pytest.mark.parametrize("items", [
    [{"op": "set", "key": "a", "value": 1}, {"op": "nope"}, {"op": "set", "key": "bad", "value": 1, "cas": 1},
     {"op": "delete", "key": "cc"}, {"op": "set", "key": "e", "value": 2}],
    [{"op": "set", "key": "a", "value": 1}, {"op": "set", "key": "bb", "value": 2}],
    [{"op": "set", "key": "a", "value": 1}, {"op": "set", "key": "bad", "value": 2}],
    [{"op": "nope"}],
    [],
])
def test_columns_say_what_each_item_got_as_the_objects_do(items: list[object]) -> None:
    """``results=columns`` carries the per-item outcome of the objects form: element i of every
    column is item i's; failed items have null fields and an entry in ``errors``."""
    objects, targets = bulk.apply(_FakeBatchWriter(), bulk.batch_of(items), "persist")
    columns, targets2 = bulk.apply(_FakeBatchWriter(), bulk.batch_of(items), "persist", columns=True)
    assert targets == targets2
    assert (columns["succeeded"], columns["failed"], columns["durability"]) == (
        objects["succeeded"], objects["failed"], "persist")
    cols = orjson.loads(orjson.dumps(columns))["columns"]
    assert set(cols) == {"status", "partition", "seqno", "cas", "rev", "deleted"}
    assert all(len(col) == len(items) for col in cols.values())
    for i, res in enumerate(objects["results"]):
        assert cols["status"][i] == res["status"]
        for name in ("partition", "seqno", "cas", "rev", "deleted"):
            assert cols[name][i] == res.get(name)
    assert columns["errors"] == [r for r in objects["results"] if r["status"] != 200]
