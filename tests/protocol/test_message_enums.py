"""Fields whose values are an enum's decode to that enum (no string mirror of it), and such enums
format as their wire text, so a detail or log line built from a decoded message reads as the wire."""
from __future__ import annotations

import enum
import json

import pytest

from engine.core.rollback import OkRule, RollbackReason
from engine.core.types import Durability, PartitionState
from engine.protocol import encoding, fields, limits, message_types, messages, schema
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.messages import (
    SnapshotSource,
    StreamEndReason,
    StreamStatus,
    decode_client_message,
    decode_server_message,
)

LOG = [[7, 0]]


def _server(**fields: object) -> object:
    return decode_server_message(json.dumps(fields))


def test_stream_response_reason_is_the_rollback_rule_enum() -> None:
    for reason in RollbackReason:
        msg = _server(type="stream_response", partition=1, status="rollback", rollback_seqno=0,
                      reason=reason.value, failover_log=LOG)
        assert msg.reason is reason and msg.status is StreamStatus.ROLLBACK


def test_failover_logs_partition_state_is_the_partition_state_enum() -> None:
    for state in PartitionState:
        msg = _server(type="failover_logs", node_id="n", partition_count=4,
                      partitions={"2": {"state": state.value, "high_seqno": 5, "purge_seqno": 0, "log": LOG}})
        assert msg.partitions[2].state is state


@pytest.mark.parametrize(("text", "want"), [
    (None, PartitionState.ACTIVE),
    ("active", PartitionState.ACTIVE),
    ("replica", PartitionState.REPLICA),
])
def test_expected_state_is_a_partition_state(text: str | None, want: PartitionState) -> None:
    req = {"type": "stream_request", "partition": 1, "uuid": 0, "start_seqno": 0, "snap_start": 0, "snap_end": 0}
    if text is not None:
        req["expected_state"] = text
    assert decode_client_message(json.dumps(req)).expected_state is want


@pytest.mark.parametrize("text", ["pending", "dead", "ACTIVE", ""])
def test_expected_state_allows_only_active_and_replica(text: str) -> None:
    req = {"type": "stream_request", "partition": 1, "uuid": 0, "start_seqno": 0, "snap_start": 0, "snap_end": 0,
           "expected_state": text}
    with pytest.raises(ProtocolError) as info:
        decode_client_message(json.dumps(req))
    assert (info.value.code, info.value.field) == ("invalid_field", "expected_state")
    assert "expected one of active, replica" in info.value.message


@pytest.mark.parametrize("enum_type", [PartitionState, Durability, RollbackReason, OkRule, StreamStatus,
                                       StreamEndReason, SnapshotSource, messages.Codec, messages.Sender, ErrorCode])
def test_wire_text_enums_format_as_their_wire_text(enum_type: type[enum.Enum]) -> None:
    for member in enum_type:
        assert f"{member}" == str(member) == member.value == json.loads(json.dumps(member))


def test_messages_is_a_facade_over_the_concept_modules() -> None:
    homes = (encoding, fields, limits, message_types, schema)
    for name in messages.__all__:
        obj = getattr(messages, name)
        assert any(getattr(home, name, None) is obj for home in homes), name
    for cls in [*message_types.CLIENT_MESSAGES.values(), *message_types.SERVER_MESSAGES.values()]:
        assert cls.__name__ in messages.__all__ and getattr(messages, cls.__name__) is cls
