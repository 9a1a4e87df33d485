"""The active's view of its replicas' acknowledgements (engine.cluster.replica_acks): tables."""
from __future__ import annotations

import pytest

from engine.cluster.replica_acks import AckError, ReplicaAck, ReplicaAcks


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], None),  # never streamed: unknown, not zero
        ([("start",)], ReplicaAck(0, 0)),
        ([("ack", 10, 5)], ReplicaAck(10, 5)),
        ([("ack", 10, 5), ("ack", 12, 12)], ReplicaAck(12, 12)),
        ([("ack", 10, 5), ("ack", 8, 3)], ReplicaAck(10, 5)),  # a late ack never lowers the figures
        ([("ack", 10, 5), ("ack", 8, 8)], ReplicaAck(10, 8)),
        ([("ack", 10, 5), ("start",)], ReplicaAck(0, 0)),  # a new stream may follow a rollback
        ([("ack", 10, 5), ("start",), ("ack", 7, 7)], ReplicaAck(7, 7)),
        ([("ack", 10, 5), ("forget",)], None),
    ],
)
def test_ack_sequences(events, expected) -> None:
    acks = ReplicaAcks()
    for event in events:
        if event[0] == "start":
            acks.stream_started("n2", 3)
        elif event[0] == "ack":
            acks.acknowledged("n2", 3, event[1], event[2])
        else:
            acks.forget("n2")
    assert acks.get("n2", 3) == expected


@pytest.mark.parametrize(("received", "persisted"), [(-1, 0), (5, -1), (5, 6)])
def test_impossible_acks_are_refused_and_change_nothing(received: int, persisted: int) -> None:
    acks = ReplicaAcks()
    acks.acknowledged("n2", 3, 4, 4)
    with pytest.raises(AckError) as error:
        acks.acknowledged("n2", 3, received, persisted)
    assert error.value.partition == 3 and "n2" in str(error.value)
    assert acks.get("n2", 3) == ReplicaAck(4, 4)


def test_partitions_and_nodes_are_kept_apart() -> None:
    acks = ReplicaAcks()
    acks.acknowledged("n2", 0, 4, 1)
    acks.acknowledged("n3", 0, 6, 6)
    acks.acknowledged("n2", 1, 9, 9)
    assert acks.replicas_of(0) == {"n2": ReplicaAck(4, 1), "n3": ReplicaAck(6, 6)}
    acks.forget("n2")
    assert acks.replicas_of(0) == {"n3": ReplicaAck(6, 6)} and acks.replicas_of(1) == {}


def test_lag_is_measured_from_the_active_high_seqno() -> None:
    assert ReplicaAck(7, 4).to_json(10) == {"received_seqno": 7, "persisted_seqno": 4, "lag": 3, "persist_lag": 6}
    assert ReplicaAck(10, 10).to_json(9)["lag"] == 0  # an active behind its own ack (a rollback race)


def test_a_stream_that_ended_forgets_only_its_own_partition() -> None:
    acks = ReplicaAcks()
    acks.acknowledged("n2", 0, 4, 1)
    acks.acknowledged("n2", 1, 9, 9)
    acks.forget_stream("n2", 0)
    acks.forget_stream("n3", 0)  # never streamed: nothing to forget
    assert acks.get("n2", 0) is None and acks.replicas_of(1) == {"n2": ReplicaAck(9, 9)}
