"""CLI helpers: partition lists, --from values, the tail line format."""
import argparse
import json

import pytest

from clients.cli import _batch_lines, _from_arg, change_line, parse_partitions
from engine.protocol.frames import decode_binary, encode_binary
from engine.core.types import Item


@pytest.mark.parametrize("text,ids", [("3", [3]), ("0,3,5-7", [0, 3, 5, 6, 7]), ("2-2, 1", [1, 2]), ("1,,1", [1])])
def test_parse_partitions(text, ids):
    assert parse_partitions(text) == ids


@pytest.mark.parametrize("text", ["", "a", "3-1", "-1", "1-x", ","])
def test_parse_partitions_errors(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_partitions(text)


@pytest.mark.parametrize("text,ok", [("beginning", True), ("now", True), ("state:/tmp/x", True), ("state:", False),
                                     ("end", False)])
def test_from_arg(text, ok):
    if ok:
        assert _from_arg(text) == text
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            _from_arg(text)


def test_lines_text_binary_and_deletions():
    batch = decode_binary(encode_binary(5, [Item(b"k\xc3\xa9", 7, 11, 2, False, b"caf\xc3\xa9"),
                                            Item(b"bin", 8, 12, 1, False, b"\xff\x00"),
                                            Item(b"gone", 9, 13, 3, True, b"")], True))
    lines = [json.loads(x) for x in _batch_lines(batch).splitlines()]
    assert lines == [
        {"partition": 5, "seqno": 7, "key": "ké", "op": "mutation", "cas": 11, "rev": 2, "value": "café"},
        {"partition": 5, "seqno": 8, "key": "bin", "op": "mutation", "cas": 12, "rev": 1, "value_b64": "/wA="},
        {"partition": 5, "seqno": 9, "key": "gone", "op": "deletion", "cas": 13, "rev": 3},
    ]
    assert json.loads(change_line(5, 9, "gone", True, 13, 3, b"")) == lines[2]
    assert json.loads(change_line(5, 7, "ké", False, 11, 2, "café".encode())) == lines[0]
