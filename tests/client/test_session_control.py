"""ClientSession rules the caller controls, as tables: "until now" ends after a history branch,
the rollback policy ("repair" vs "report"), and seeks (java-dcp-client's rollbackAndRestartStream)."""
import pytest

from clients.errors import UsageError
from clients.ring import RollbackRing
from engine.core.types import FailoverEntry as FE
from engine.protocol.client.actions import RollbackPolicy, SeekAction
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.session import ClientSession
from engine.protocol.messages import PartitionInfo, StreamRequest

LOG0 = (FE(7, 40), FE(3, 0))
INFOS = {0: PartitionInfo("active", 50, 0, LOG0), 1: PartitionInfo("active", 9, 0, (FE(5, 0),))}


def req(p, uuid, seqno, ss, se, end=None):
    return StreamRequest(p, uuid, seqno, ss, se, end_seqno=end)


def reconnect(s, high, log=LOG0, p=0):
    s.connection_lost()
    infos = dict(INFOS)
    infos[p] = PartitionInfo("active", high, 0, log)
    return s.handshake("node", 2, infos)


# ---------------------------------------------------------------------------------------------- until now
NEW_BRANCH = (FE(11, 30), *LOG0)
LOWER_CASES = [
    # desc, reconnect high, log at reconnect, expected end of partition 0, lowered_ends
    ("same branch, more items: the goal stays", 80, LOG0, 50, {}),
    ("new branch with fewer items: lowered to its high seqno", 30, NEW_BRANCH, 30, {0: 50}),
    ("new branch that already passed the end: the goal stays", 60, NEW_BRANCH, 50, {}),
    ("new branch exactly at the end", 50, NEW_BRANCH, 50, {}),
    ("same branch reporting less (no branch: not lowered)", 30, LOG0, 50, {}),
]


@pytest.mark.parametrize("desc,high,log,end,lowered", LOWER_CASES, ids=[c[0] for c in LOWER_CASES])
def test_until_now_end_lowered_only_after_a_branch(desc, high, log, end, lowered):
    s = ClientSession(start="beginning", until_now=True)
    s.handshake("node", 2, INFOS)
    assert reconnect(s, high, log) == [req(0, 0, 0, 0, 0, end), req(1, 0, 0, 0, 0, 9)]
    assert s.lowered_ends == lowered


def test_lowered_twice_keeps_the_first_end():
    s = ClientSession(start="beginning", until_now=True)
    s.handshake("node", 2, INFOS)
    reconnect(s, 30, NEW_BRANCH)
    assert reconnect(s, 20, (FE(12, 20), *NEW_BRANCH))[0].end_seqno == 20
    assert s.lowered_ends == {0: 50}


def test_explicit_end_seqnos_are_never_lowered():
    s = ClientSession(start="beginning", end_seqnos={0: 50})
    s.handshake("node", 2, INFOS)
    assert reconnect(s, 30, NEW_BRANCH)[0].end_seqno == 50
    assert s.lowered_ends == {}


def test_finished_partitions_are_left_alone():
    s = ClientSession(start="beginning", until_now=True)
    s.handshake("node", 2, INFOS)
    s.stream_end(0, "end_seqno_reached", 50)
    assert reconnect(s, 30, NEW_BRANCH) == [req(1, 0, 0, 0, 0, 9)]
    assert s.lowered_ends == {}


# ---------------------------------------------------------------------------------------------- policy
def _streamed(policy, ring_size=100):
    ring = RollbackRing(ring_size) if ring_size else None
    s = ClientSession(start="beginning", ring=ring, on_rollback=policy)
    s.handshake("node", 2, INFOS)
    s.stream_ok(0, LOG0)
    if ring is not None:
        ring.append_batch(0, [10, 20, 30, 35], [b"a", b"b", b"c", b"a"])
    pos = s.positions[0]
    pos.snapshot_marker(1, 35)
    pos.items(10, 35)
    pos.snapshot_end()
    return s, ring


POLICY_CASES = [
    # policy, ring size, rollback seqno, keys, reset, resume offset
    ("repair", 100, 20, (b"c", b"a"), False, StreamOffset.at(3, 20)),
    ("repair", 0, 20, (), True, StreamOffset()),            # no ring: cannot know what to undo
    ("report", 100, 20, (), False, StreamOffset.at(3, 20)),  # the caller decides: no keys, no reset
    ("report", 0, 20, (), False, StreamOffset.at(3, 20)),
    ("report", 0, 45, (), False, StreamOffset.at(7, 45)),    # the newest branch at or below R
    ("report", 0, 0, (), False, StreamOffset.at(3, 0)),
]


@pytest.mark.parametrize("policy,ring_size,seqno,keys,reset,resume", POLICY_CASES)
def test_rollback_policy_plans(policy, ring_size, seqno, keys, reset, resume):
    s, _ = _streamed(policy, ring_size)
    plan = s.plan_rollback(0, seqno, "diverged", "", LOG0)
    assert (plan.keys, plan.reset, plan.resume) == (keys, reset, resume)
    assert 0 not in s.open  # a rollback answer opens no stream
    assert s.finish_rollback(plan) == req(0, resume.uuid, resume.seqno, resume.seqno, resume.seqno)


def test_report_drops_the_ring_above_the_point():
    s, ring = _streamed("report")
    s.finish_rollback(s.plan_rollback(0, 20, "diverged", "", LOG0))
    assert [e.seqno for e in ring.entries(0)] == [10, 20] and ring.floor(0) == 0


def test_unknown_policy_is_a_usage_error():
    with pytest.raises(UsageError, match="on_rollback"):
        ClientSession(on_rollback="ignore")
    assert ClientSession(on_rollback=RollbackPolicy.REPORT).on_rollback is RollbackPolicy.REPORT


# ---------------------------------------------------------------------------------------------- seek
def test_seek_while_handling_a_rollback_replaces_the_resume_point():
    s, ring = _streamed("report")
    plan = s.plan_rollback(0, 30, "diverged", "", LOG0)
    assert s.seek(0, StreamOffset.at(3, 10)) is SeekAction.LATER
    assert s.finish_rollback(plan) == req(0, 3, 10, 10, 10)
    assert [e.seqno for e in ring.entries(0)] == [10] and ring.floor(0) == 0
    assert s.positions[0].failover_log == (FE(3, 0),)  # branches after the sought seqno forgotten


def test_seek_during_a_reset_wins_over_the_restart_from_zero():
    s, _ = _streamed("repair", ring_size=0)
    plan = s.plan_rollback(0, 5, "diverged", "", LOG0)
    assert plan.reset
    s.seek(0, StreamOffset(3, 4, 2, 8))
    assert s.finish_rollback(plan) == req(0, 3, 4, 2, 8)


def test_seek_of_a_streaming_partition_needs_a_reconnect():
    s, ring = _streamed("repair")
    assert s.seek(0, StreamOffset.at(3, 20)) is SeekAction.RECONNECT
    requests = reconnect(s, 50)
    assert requests[0] == req(0, 3, 20, 20, 20)
    assert not s.repairs  # the ring's keys above 20 were dropped, not "repaired"
    assert [e.seqno for e in ring.entries(0)] == [10, 20]


def test_seek_of_a_finished_partition_requests_it_again():
    s = ClientSession(start="beginning", until_now=True)
    s.handshake("node", 2, INFOS)
    for p in (0, 1):
        s.stream_end(p, "end_seqno_reached", None)
    assert s.all_finished
    assert s.seek(1, StreamOffset.at(5, 3)) is SeekAction.REQUEST
    assert not s.all_finished
    assert s.request_for(1) == req(1, 5, 3, 3, 3, 9)


def test_seek_before_the_handshake_is_a_start_offset():
    s = ClientSession(start="beginning", partitions=[0])
    assert s.seek(0, StreamOffset.at(7, 45)) is SeekAction.LATER
    assert s.handshake("node", 2, INFOS) == [req(0, 7, 45, 45, 45)]


@pytest.mark.parametrize("seek_to,old_floor,floor", [
    (40, 0, 40),    # forward: what was skipped over is not in the ring
    (20, 0, 0),     # back, above the floor: the entries below stay useful
    (5, 10, 5),     # back, below the floor: nothing above 5 is applied any more
])
def test_seek_ring_floor(seek_to, old_floor, floor):
    s, ring = _streamed("repair")
    ring.set_floor(0, old_floor)
    s.seek(0, StreamOffset.at(7 if seek_to >= 40 else 3, seek_to))
    s.connection_lost()
    s.handshake("node", 2, INFOS)
    assert ring.floor(0) == floor
    assert all(e.seqno <= seek_to for e in ring.entries(0))


@pytest.mark.parametrize("kw,p,offset,match", [
    (dict(), 9, StreamOffset(), "not one of"),
    (dict(until_now=True), 1, StreamOffset.at(5, 10), "after the stream's end"),
    (dict(), 0, 12, "StreamOffset"),
])
def test_seek_errors(kw, p, offset, match):
    s = ClientSession(start="beginning", **kw)
    s.handshake("node", 2, INFOS)
    with pytest.raises(UsageError, match=match):
        s.seek(p, offset)
