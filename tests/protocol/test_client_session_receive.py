"""``ClientSession.receive``: every server message after the handshake, as a table of
(messages in, actions or typed error out), with no socket (the ``ServerSession`` tests' habit)."""
from __future__ import annotations

import pytest

from engine.core.types import FailoverEntry as FE
from engine.protocol import messages as M
from engine.protocol.client.actions import (
    Deliver,
    EndAction,
    Reconnect,
    Repair,
    RollbackPlan,
    Send,
    StreamEnded,
)
from engine.protocol.client.errors import ProtocolViolation, ServerError, StreamRejected, UsageError
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.ring import RingModel
from engine.protocol.client.session import MAX_NOT_MY_PARTITION, ClientSession
from engine.protocol.frames import decode_binary, encode_binary
from engine.core.types import Item

INFOS = {0: M.PartitionInfo("active", 50, 0, (FE(7, 40), FE(3, 0))), 1: M.PartitionInfo("active", 9, 0, (FE(5, 0),))}
LOGS = M.FailoverLogs("node-a", 2, INFOS)


def started(**kw) -> ClientSession:
    session = ClientSession(start="beginning", **kw)
    session.receive_handshake(LOGS, 100)
    return session


def batch(p: int, *seqnos: int, last: bool = False):
    items = [Item(f"k{s}".encode(), s, 1, 1, False, b"v") for s in seqnos]
    return decode_binary(encode_binary(p, items, last))


def req(p, uuid=0, seqno=0, ss=0, se=0, end=None):
    return M.StreamRequest(p, uuid, seqno, ss, se, end_seqno=end)


def ok(p, log=(FE(7, 40), FE(3, 0))):
    return M.StreamResponse(p, M.StreamStatus.OK, failover_log=log)


def marker(p, start, end):
    return M.SnapshotMarker(p, start, end, M.SnapshotSource.MEMORY)


def end(p, reason, last=None):
    return M.StreamEndMessage(p, M.StreamEndReason(reason), last)


# (description, session kwargs, messages fed before the last one, the last message, expected actions)
CASES = [
    ("stream ok adopts the log and asks nothing", {}, [], ok(0), []),
    ("a snapshot marker is delivered", {}, [ok(0)], marker(0, 1, 5), [Deliver(marker(0, 1, 5))]),
    ("barrier reached is delivered", {}, [], M.BarrierReachedMessage("c1", {0: 3}), [Deliver(M.BarrierReachedMessage("c1", {0: 3}))]),
    ("cycle complete asks nothing", {}, [], M.CycleComplete(1), []),
    ("end seqno reached finishes the partition", {}, [ok(0)], end(0, "end_seqno_reached", 5),
     [StreamEnded(0, "end_seqno_reached", 5, None, EndAction.FINISHED)]),
    ("too slow re-requests from the processed position", {}, [ok(0)], end(0, "too_slow"),
     [StreamEnded(0, "too_slow", None, None, EndAction.REREQUEST), Send(req(0, uuid=7))]),
    ("state changed reconnects", {}, [ok(0)], end(0, "state_changed"),
     [StreamEnded(0, "state_changed", None, None, EndAction.RECONNECT),
      Reconnect("partition 0 stream ended: state_changed")]),
    ("not my partition reconnects", {}, [], M.StreamResponse(1, M.StreamStatus.NOT_MY_PARTITION),
     [Reconnect("partition 1: not my partition; reloading the partition map")]),
    ("rollback with no ring and nothing applied above it resumes there", {}, [],
     M.StreamResponse(0, M.StreamStatus.ROLLBACK, rollback_seqno=0, reason="diverged", failover_log=(FE(9, 0),)),
     [Repair(RollbackPlan(0, 0, "diverged", "", (FE(9, 0),), (), False, StreamOffset.at(9, 0)))]),
    ("the reset policy resets on any rollback", {"on_rollback": "reset"}, [],
     M.StreamResponse(0, M.StreamStatus.ROLLBACK, rollback_seqno=0, reason="diverged", failover_log=(FE(9, 0),)),
     [Repair(RollbackPlan(0, 0, "diverged", "", (FE(9, 0),), (), True, StreamOffset.beginning()))]),
]


@pytest.mark.parametrize("desc,kw,before,msg,expected", CASES, ids=[c[0] for c in CASES])
def test_receive(desc, kw, before, msg, expected):
    session = started(**kw)
    for m in before:
        session.receive(m)
    assert session.receive(msg) == expected


VIOLATIONS = [
    ("items before the stream is open: no stream after an end", [ok(0), end(0, "end_seqno_reached")], batch(0, 1)),
    ("items for a partition never requested", [], batch(5, 1)),
    ("a marker for a finished stream", [ok(0), end(0, "closed")], marker(0, 1, 2)),
    ("a stream response for a partition never requested", [], ok(5)),
    ("a stream end for a partition never requested", [], end(5, "closed")),
    ("failover logs after the handshake", [], LOGS),
    ("a marker whose start is after its end", [ok(0)], marker(0, 9, 5)),
]


@pytest.mark.parametrize("desc,before,msg", VIOLATIONS, ids=[c[0] for c in VIOLATIONS])
def test_protocol_violations_are_typed(desc, before, msg):
    session = started()
    for m in before:
        session.receive(m)
    with pytest.raises(ProtocolViolation):
        session.receive(msg)


def test_an_open_stream_delivers_its_batches_and_the_position_moves_only_when_processed():
    session = started()
    session.receive(ok(0))
    session.receive(marker(0, 1, 3))
    b = batch(0, 1, 3, last=True)
    assert session.receive(b) == [Deliver(b)]
    assert session.positions[0].seqno == 0          # received, not processed
    session.positions[0].items(1, 3)
    assert session.snapshot_done(0) == (1, 3)
    assert session.committed()[0] == StreamOffset(7, 3, 1, 3)


def test_server_errors_and_range_errors_are_typed():
    session = started()
    with pytest.raises(ServerError) as err:
        session.receive(M.Error("internal", "boom"))
    assert err.value.server_code == "internal"
    with pytest.raises(StreamRejected) as rej:
        session.receive(M.StreamResponse(0, M.StreamStatus.RANGE_ERROR, detail="bad"))
    assert rej.value.status == "range_error" and rej.value.partition == 0


def test_not_my_partition_is_given_up_after_the_limit_and_an_ok_forgives():
    session = started()
    nmp = M.StreamResponse(1, M.StreamStatus.NOT_MY_PARTITION)
    for _ in range(MAX_NOT_MY_PARTITION - 1):
        assert type(session.receive(nmp)[0]) is Reconnect
    session.receive(ok(1, (FE(5, 0),)))
    for _ in range(MAX_NOT_MY_PARTITION - 1):
        session.receive(nmp)
    with pytest.raises(StreamRejected):
        session.receive(nmp)


HANDSHAKE_ANSWERS = [
    (M.Error("invalid_partition", "no such partition", field="partitions"), UsageError),
    (M.Error("too_many_connections", "later"), ServerError),
    (M.CycleComplete(1), ProtocolViolation),
    (b"\x00binary", ProtocolViolation),
]


@pytest.mark.parametrize("msg,error", HANDSHAKE_ANSWERS)
def test_handshake_answers_other_than_failover_logs_are_typed(msg, error):
    with pytest.raises(error):
        ClientSession().receive_handshake(msg)


def test_handshake_sends_requests_and_queues_repairs_of_unsaved_progress_first():
    ring = RingModel(10)
    ring.set_floor(0, 0)
    ring.append_batch(0, [1, 2], [b"a", b"b"])
    session = ClientSession(start="beginning", ring=ring)
    actions = session.receive_handshake(LOGS)
    assert [type(a) for a in actions] == [Repair, Send]
    assert actions[0].unsaved and actions[0].plan.keys == (b"a", b"b")
    assert actions[1] == Send(req(1))
    assert session.finish_repair(actions[0].plan, ()) == req(0)


def test_acks_follow_one_policy_and_a_new_connection_starts_a_new_window():
    session = ClientSession(window_bytes=1000, ack_ratio=0.2)
    session.receive_handshake(LOGS, 150)
    assert session.processed(50) == M.Ack(200)
    assert session.processed(100) is None
    session.connection_lost()
    session.receive_handshake(LOGS, 10)
    assert session.processed(190) == M.Ack(200)


def test_hello_names_the_requested_partitions_and_window():
    hello = ClientSession(partitions=[3, 1], window_bytes=4096).hello("me", "json", bundle=True)
    assert hello == M.Hello("me", (1, 3), M.Codec.JSON, 4096, bundle=True)


def test_the_ring_model_journals_updates_for_its_log_and_the_session_writes_nothing():
    ring = RingModel(10, journal=True)
    session = ClientSession(start="beginning", ring=ring)
    session.receive_handshake(LOGS)
    journal = ring.take_journal()
    assert len(journal) == 2  # the floors of partitions 0 and 1, for the adapter to write
    replayed = RingModel(10)
    for payload, _ in journal:
        replayed.apply(payload)
    assert replayed.floor(0) == replayed.floor(1) == 0
