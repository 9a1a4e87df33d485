"""Control messages: round trips, and a typed error naming the field for every kind of bad input."""
from __future__ import annotations

import json

import pytest

from engine.protocol.errors import CloseCode, ProtocolError
from engine.protocol.frames import ItemBatch, encode_json
from engine.protocol.messages import (
    CLIENT_MESSAGES,
    MAX_COOKIE_CHARS,
    MAX_NAME_CHARS,
    SERVER_MESSAGES,
    Barrier,
    Hello,
    Sender,
    decode,
    decode_client_message,
    decode_server_message,
    encode,
)
from engine.core.types import Item
from tests.protocol.examples import CLIENT_EXAMPLES, SERVER_EXAMPLES


@pytest.mark.parametrize("msg", CLIENT_EXAMPLES, ids=lambda m: type(m).__name__)
def test_client_messages_round_trip(msg: object) -> None:
    assert decode_client_message(encode(msg)) == msg


@pytest.mark.parametrize("msg", SERVER_EXAMPLES, ids=lambda m: type(m).__name__)
def test_server_messages_round_trip(msg: object) -> None:
    assert decode_server_message(encode(msg)) == msg


def test_every_message_type_has_an_example() -> None:
    assert {type(m) for m in CLIENT_EXAMPLES} == set(CLIENT_MESSAGES.values())
    assert {type(m) for m in SERVER_EXAMPLES} == set(SERVER_MESSAGES.values())


def test_encoded_text_is_ascii_so_its_length_is_its_byte_count() -> None:
    text = encode(Hello("naïve-consumer-✓"))
    assert len(text) == len(text.encode("utf-8"))
    assert decode_client_message(text).name == "naïve-consumer-✓"


def test_optional_fields_take_their_defaults() -> None:
    assert decode_client_message('{"type":"hello","name":"x"}') == Hello("x")


def test_barrier_type_is_read_according_to_the_sender() -> None:
    assert decode_client_message('{"type":"barrier","cookie":"c"}') == Barrier("c")
    with pytest.raises(ProtocolError) as info:
        decode_server_message('{"type":"barrier","cookie":"c"}')
    assert info.value.field == "seqnos"


def test_server_items_message_decodes_to_an_item_batch() -> None:
    text = encode_json(5, [Item(b"k", 1, 2, 1, False, b"v")], last=True)
    batch = decode(text, sender=Sender.SERVER)
    assert isinstance(batch, ItemBatch) and batch.keys == [b"k"] and batch.last


def hello(**fields: object) -> str:
    return json.dumps({"type": "hello", "name": "c", **fields})


def request(**fields: object) -> str:
    base = {"type": "stream_request", "partition": 1, "uuid": 1, "start_seqno": 0, "snap_start": 0, "snap_end": 0}
    return json.dumps({**base, **fields})


BAD_CLIENT_INPUT = [
    ("malformed JSON", "{not json", "malformed_json", None),
    ("truncated JSON", '{"type":"hello"', "malformed_json", None),
    ("not an object", "[1, 2]", "not_an_object", None),
    ("missing type", "{}", "missing_field", "type"),
    ("type not a string", '{"type": 5}', "invalid_field", "type"),
    ("unknown type", '{"type": "subscribe"}', "unknown_type", "type"),
    ("server-only type from a client", '{"type": "cycle_complete", "cycle": 1}', "unknown_type", "type"),
    ("hello without name", '{"type": "hello"}', "missing_field", "name"),
    ("empty name", hello(name=""), "invalid_field", "name"),
    ("name over the limit", hello(name="x" * (MAX_NAME_CHARS + 1)), "invalid_field", "name"),
    ("name not a string", hello(name=7), "invalid_field", "name"),
    ("partitions not a list", hello(partitions="all"), "invalid_field", "partitions"),
    ("duplicate partitions", hello(partitions=[1, 1]), "invalid_field", "partitions"),
    ("partition id over u16", hello(partitions=[0, 70000]), "invalid_field", "partitions[1]"),
    ("negative partition id", hello(partitions=[-1]), "invalid_field", "partitions[0]"),
    ("unknown codec", hello(codec="msgpack"), "invalid_field", "codec"),
    ("window not an int", hello(window_bytes="big"), "invalid_field", "window_bytes"),
    ("unknown field", hello(colour="blue"), "unknown_field", "colour"),
    ("boolean is not an integer", request(partition=True), "invalid_field", "partition"),
    ("float seqno", request(start_seqno=1.5), "invalid_field", "start_seqno"),
    ("negative seqno", request(start_seqno=-1), "invalid_field", "start_seqno"),
    ("uuid over 2^64-1", request(uuid=1 << 64), "invalid_field", "uuid"),
    ("expected_state not active/replica", request(expected_state="dead"), "invalid_field", "expected_state"),
    ("to_now not a boolean", request(to_now=1), "invalid_field", "to_now"),
    ("missing start_seqno", json.dumps({"type": "stream_request", "partition": 1, "uuid": 1, "snap_start": 0,
                                        "snap_end": 0}), "missing_field", "start_seqno"),
    ("cookie too long", json.dumps({"type": "barrier", "cookie": "c" * (MAX_COOKIE_CHARS + 1)}), "invalid_field",
     "cookie"),
    ("empty cookie", json.dumps({"type": "barrier", "cookie": ""}), "invalid_field", "cookie"),
    ("ack bytes as string", json.dumps({"type": "ack", "bytes": "10"}), "invalid_field", "bytes"),
]


@pytest.mark.parametrize(("case", "text", "code", "field"), BAD_CLIENT_INPUT, ids=[c[0] for c in BAD_CLIENT_INPUT])
def test_bad_client_input_raises_a_protocol_error_naming_the_field(
    case: str, text: str, code: str, field: str | None
) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_client_message(text)
    assert info.value.code == code
    assert info.value.field == field
    assert info.value.close_code == CloseCode.PROTOCOL_ERROR


def test_oversized_message_is_refused_before_parsing_with_close_1009() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_client_message(hello(name="x" * 100), max_bytes=50)
    assert info.value.code == "message_too_large"
    assert info.value.close_code == CloseCode.MESSAGE_TOO_BIG


def test_deeply_nested_json_is_malformed_not_a_crash() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_client_message("[" * 100_000 + "]" * 100_000)
    assert info.value.code in ("malformed_json", "not_an_object")


BAD_SERVER_INPUT = [
    ("partition map key not an id", {"type": "failover_logs", "node_id": "n", "partition_count": 4,
                                     "partitions": {"x": {}}}, "partitions.x"),
    ("failover entry not a pair", {"type": "failover_logs", "node_id": "n", "partition_count": 4,
                                   "partitions": {"1": {"state": "active", "high_seqno": 0, "purge_seqno": 0,
                                                        "log": [[1]]}}}, "partitions.1.log[0]"),
    ("unknown partition state", {"type": "failover_logs", "node_id": "n", "partition_count": 4,
                                 "partitions": {"1": {"state": "zombie", "high_seqno": 0, "purge_seqno": 0,
                                                      "log": []}}}, "partitions.1.state"),
    ("unknown rollback reason", {"type": "stream_response", "partition": 1, "status": "rollback",
                                 "reason": "because"}, "reason"),
    ("unknown stream end reason", {"type": "stream_end", "partition": 1, "reason": "bored", "last_seqno": 0},
     "reason"),
    ("barrier seqno negative", {"type": "barrier", "cookie": "c", "seqnos": {"1": -1}}, "seqnos.1"),
]


@pytest.mark.parametrize(("case", "obj", "field"), BAD_SERVER_INPUT, ids=[c[0] for c in BAD_SERVER_INPUT])
def test_bad_server_input_names_the_nested_field(case: str, obj: dict, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_server_message(json.dumps(obj))
    assert info.value.field == field
