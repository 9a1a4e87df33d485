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
        return [WriteResult(op.key, 0, i + 1, 7, 1, op.op is Op.DELETION) for i, op in enumerate(ops)]


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
        assert type(recorder.ops[0]) is WriteOp
        assert result["status"] == 200
    else:
        assert recorder.ops == []
        assert result == {"index": 0, "status": expected.status, "error": expected.body()}
