"""``seqno_ack``: a replica's report of what it holds, accepted on replication connections only."""
from __future__ import annotations

from typing import Any

import pytest

from engine.protocol.bundle import encode_bundle
from engine.protocol.messages import SeqnoAck, encode
from engine.protocol.session import REPLICATION_PREFIX, SessionState
from tests.protocol.test_session import Harness, error


def _replication(name: str = REPLICATION_PREFIX + "n2") -> Harness:
    h = Harness()
    h.hello(name=name)
    h.open(3, start=10, snap=(10, 10))
    return h


def test_a_replication_connection_records_the_latest_ack_per_partition() -> None:
    h = _replication()
    assert h.client("seqno_ack", partition=3, received=12, persisted=10) == []
    assert h.client("seqno_ack", partition=3, received=15, persisted=15) == []
    assert h.session.replica_acks == {3: SeqnoAck(3, 15, 15)}


@pytest.mark.parametrize(
    ("name", "fields", "expected"),
    [
        ("consumer", {"partition": 3, "received": 1, "persisted": 1}, error("not_replication", "type", 3)),
        (REPLICATION_PREFIX + "n2", {"partition": 5, "received": 1, "persisted": 1},
         error("stream_not_open", "partition", 5)),
        (REPLICATION_PREFIX + "n2", {"partition": 3, "received": 4, "persisted": 5},
         error("invalid_field", "persisted", 3)),
    ],
)
def test_refused_acks_get_an_error_and_keep_the_connection(name: str, fields: dict[str, Any], expected) -> None:
    h = _replication(name)
    assert h.client("seqno_ack", **fields) == [expected]
    assert h.session.state is SessionState.STREAMING and h.session.replica_acks == {}


def test_a_malformed_ack_closes_like_any_malformed_message() -> None:
    h = _replication()
    out = h.client("seqno_ack", partition=3, received=-1, persisted=0)
    assert out[0]["code"] == "invalid_field" and out[-1] == {"close": 1008}


def test_a_caller_without_the_admin_role_cannot_open_a_replication_connection() -> None:
    h = Harness()
    h.session.may_replicate = False
    assert h.hello(name=REPLICATION_PREFIX + "n2") == [error("replication_forbidden", "name"), {"close": 1008}]
    assert h.session.state is SessionState.CLOSED
    consumer = Harness()
    consumer.session.may_replicate = False
    assert consumer.hello(name="indexer")[-1]["type"] == "failover_logs"


def _bundled(h: Harness, *parts: str | bytes) -> list[dict[str, Any]]:
    return h.feed(h.session.receive_binary(encode_bundle(list(parts))))


def test_a_client_that_accepts_bundles_may_send_its_acks_in_one() -> None:
    h = Harness()
    h.hello(name=REPLICATION_PREFIX + "n2", bundle=True)
    h.open(3, start=10, snap=(10, 10))
    h.open(4, start=10, snap=(10, 10))
    acks = [encode(SeqnoAck(3, 12, 10)), encode(SeqnoAck(4, 11, 11)), encode(SeqnoAck(3, 13, 12))]
    assert _bundled(h, *acks) == []
    assert h.session.replica_acks == {3: SeqnoAck(3, 13, 12), 4: SeqnoAck(4, 11, 11)}
    # a refused part gets its error; the parts around it are taken as if sent alone
    out = _bundled(h, encode(SeqnoAck(5, 1, 1)), encode(SeqnoAck(4, 14, 12)))
    assert out == [error("stream_not_open", "partition", 5)] and h.session.replica_acks[4] == SeqnoAck(4, 14, 12)


@pytest.mark.parametrize("bundle", [False, True])
def test_client_bundles_hold_text_messages_and_need_hello_bundle(bundle: bool) -> None:
    h = Harness()
    h.hello(name=REPLICATION_PREFIX + "n2", bundle=bundle)
    h.open(3, start=10, snap=(10, 10))
    part = encode(SeqnoAck(3, 12, 10)) if not bundle else b"UPRB binary"
    assert _bundled(h, part, encode(SeqnoAck(3, 13, 10))) == [error("unsupported_data"), {"close": 1003}]
    assert h.session.state is SessionState.CLOSED and h.session.replica_acks == {}
