"""``bulk.apply``'s inline fast path must build exactly what ``bulk.to_op`` builds (or send the
item to ``to_op`` for its error), for every shape of item."""
from __future__ import annotations

import base64

import pytest

from app import bulk
from engine.types import Op, WriteOp, WriteResult


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
