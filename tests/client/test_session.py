"""ClientSession rules as tables: start modes, rollback plans, stream ends (no I/O anywhere)."""
import pytest

from clients.errors import StreamRejected, UsageError
from clients.ring import RollbackRing
from clients.state import ConsumerState, PartitionCheckpoint
from engine.core.types import FailoverEntry as FE
from engine.protocol.client.actions import EndAction
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.session import ClientSession
from engine.protocol.messages import PartitionInfo, StreamRequest

INFOS = {
    0: PartitionInfo("active", 50, 0, (FE(7, 40), FE(3, 0))),
    1: PartitionInfo("active", 9, 0, (FE(5, 0),)),
}
SAVED = ConsumerState({0: PartitionCheckpoint(StreamOffset(3, 30, 25, 35), (FE(3, 0),), (20, 24)),
                       5: PartitionCheckpoint(StreamOffset(1, 2, 2, 2))}, "node", 2)


def req(p, uuid, seqno, ss, se, end=None):
    return StreamRequest(p, uuid, seqno, ss, se, end_seqno=end)


START_CASES = [
    ("beginning", dict(start="beginning"), [req(0, 0, 0, 0, 0), req(1, 0, 0, 0, 0)]),
    ("now", dict(start="now"), [req(0, 7, 50, 50, 50), req(1, 5, 9, 9, 9)]),
    ("saved resumes the partial snapshot honestly", dict(start="saved", saved=SAVED),
     [req(0, 3, 30, 25, 35), req(1, 0, 0, 0, 0)]),
    ("saved with no state is the beginning", dict(start="saved"), [req(0, 0, 0, 0, 0), req(1, 0, 0, 0, 0)]),
    ("explicit offsets win over saved state", dict(start="saved", saved=SAVED, offsets={0: StreamOffset(7, 45, 45, 45)}),
     [req(0, 7, 45, 45, 45), req(1, 0, 0, 0, 0)]),
    ("until now freezes the high seqnos", dict(start="beginning", until_now=True),
     [req(0, 0, 0, 0, 0, 50), req(1, 0, 0, 0, 0, 9)]),
    ("explicit end seqnos", dict(start="beginning", end_seqnos={1: 4}), [req(0, 0, 0, 0, 0), req(1, 0, 0, 0, 0, 4)]),
    ("partition subset", dict(start="beginning", partitions=[1]), [req(1, 0, 0, 0, 0)]),
]


@pytest.mark.parametrize("desc,kw,expected", START_CASES, ids=[c[0] for c in START_CASES])
def test_start_modes(desc, kw, expected):
    assert ClientSession(**kw).handshake("node", 2, INFOS) == expected


@pytest.mark.parametrize("kw,floors", [
    (dict(start="beginning"), {0: 0, 1: 0}),
    (dict(start="now"), {0: 0, 1: 0}),              # nothing below "now" was applied
    (dict(start="saved", saved=SAVED), {0: 30, 1: 0}),  # ring lost, state kept: cover from the saved seqno
])
def test_ring_floors_declared_once(kw, floors):
    ring = RollbackRing(10)
    ClientSession(ring=ring, **kw).handshake("node", 2, INFOS)
    assert {p: ring.floor(p) for p in (0, 1)} == floors


def test_known_ring_floor_is_kept():
    ring = RollbackRing(10)
    ring.set_floor(0, 12)
    ClientSession(ring=ring, start="saved", saved=SAVED).handshake("node", 2, INFOS)
    assert ring.floor(0) == 12


def test_reconnect_keeps_positions_and_skips_finished():
    s = ClientSession(start="beginning", until_now=True)
    s.handshake("node", 2, INFOS)
    s.stream_ok(0, INFOS[0].log)
    pos = s.positions[0]
    pos.snapshot_marker(1, 20)
    pos.item(4)
    assert s.stream_end(1, "end_seqno_reached", 9) is EndAction.FINISHED
    s.connection_lost()
    later = {0: PartitionInfo("active", 80, 0, INFOS[0].log), 1: INFOS[1]}
    assert s.handshake("node", 2, later) == [req(0, 7, 4, 1, 20, 50)]  # end still the first high seqno


def _session_with_ring():
    ring = RollbackRing(100)
    s = ClientSession(start="beginning", ring=ring)
    s.handshake("node", 2, INFOS)
    for seqno, key in [(10, b"a"), (20, b"b"), (30, b"c"), (35, b"a")]:
        ring.append(0, seqno, key)
    pos = s.positions[0]
    pos.snapshot_marker(1, 35)
    pos.items(10, 35)
    pos.snapshot_end()
    return s, ring


@pytest.mark.parametrize("seqno,keys,reset", [
    (20, (b"c", b"a"), False),
    (0, (b"a", b"b", b"c"), False),  # the ring covers this partition from 0
    (35, (), False),
])
def test_rollback_plans(seqno, keys, reset):
    s, _ = _session_with_ring()
    plan = s.plan_rollback(0, seqno, "diverged", "x", INFOS[0].log)
    assert (plan.keys, plan.reset) == (keys, reset)
    assert s.rollbacks == 1 and s.rollback_counts == {"diverged": 1}


def test_rollback_deeper_than_the_ring_resets():
    ring = RollbackRing(2)
    s = ClientSession(start="beginning", ring=ring)
    s.handshake("node", 2, INFOS)
    ring.append_batch(0, [10, 20, 30], [b"a", b"b", b"c"])  # evicts seqno 10: floor 10
    assert s.plan_rollback(0, 15, "diverged", "", ()).keys == (b"b", b"c")
    plan = s.plan_rollback(0, 5, "unknown_uuid", "", ())
    assert plan.reset
    assert s.finish_rollback(plan) == req(0, 0, 0, 0, 0)
    assert ring.entries(0) == [] and ring.floor(0) == 0 and s.resets == 1


def test_finish_rollback_keeps_corrections_above_r_in_the_ring():
    s, ring = _session_with_ring()
    plan = s.plan_rollback(0, 20, "diverged", "", (FE(9, 20), FE(3, 0)))
    assert s.finish_rollback(plan, [(b"a", 51)]) == req(0, 9, 20, 20, 20)
    assert [(e.seqno, e.key) for e in ring.entries(0)] == [(10, b"a"), (20, b"b"), (51, b"a")]


@pytest.mark.parametrize("applied,seqno,reset", [(0, 0, False), (30, 40, False), (30, 20, True)])
def test_rollback_without_a_ring(applied, seqno, reset):
    s = ClientSession(start="saved", saved=ConsumerState({0: PartitionCheckpoint(StreamOffset.at(3, applied))}),
                      partitions=[0])
    s.handshake("node", 2, INFOS)
    assert s.plan_rollback(0, seqno, None, None, ()).reset is reset


@pytest.mark.parametrize("reason,action", [
    ("end_seqno_reached", EndAction.FINISHED), ("closed", EndAction.FINISHED), ("too_slow", EndAction.REREQUEST),
    ("state_changed", EndAction.RECONNECT), ("shutting_down", EndAction.RECONNECT),
])
def test_stream_end_actions(reason, action):
    s = ClientSession(start="beginning")
    s.handshake("node", 2, INFOS)
    assert s.stream_end(0, reason, 0) is action


def test_all_finished():
    s = ClientSession(start="beginning", until_now=True)
    s.handshake("node", 2, INFOS)
    s.stream_end(0, "end_seqno_reached", 50)
    assert not s.all_finished
    s.stream_end(1, "end_seqno_reached", 9)
    assert s.all_finished and s.bounded


def test_errors():
    s = ClientSession(start="saved", saved=SAVED)
    s.handshake("node", 2, INFOS)
    with pytest.raises(StreamRejected, match="out of range") as info:
        s.range_error(0, "start_seqno > high_seqno")
    assert info.value.partition == 0
    with pytest.raises(UsageError):
        ClientSession(partitions=[4]).handshake("node", 2, INFOS)
    with pytest.raises(UsageError):
        ClientSession(until_now=True, end_seqnos={0: 1})
    with pytest.raises(UsageError):
        ClientSession(offsets={0: StreamOffset.at(1, 9)}, end_seqnos={0: 3})
    with pytest.raises(StreamRejected):
        ClientSession(partitions=[0, 1]).handshake("node", 2, {0: INFOS[0]})


def test_state_keeps_partitions_not_streamed():
    s = ClientSession(start="saved", saved=SAVED, partitions=[0])
    s.handshake("node", 2, INFOS)
    st = s.state()
    assert set(st.partitions) == {0, 5} and st.partitions[0].last_complete == (20, 24)
    assert s.committed() == {0: StreamOffset(3, 30, 25, 35)}


def test_repairs_withhold_the_request_until_corrections_are_done():
    ring = RollbackRing(100)
    ring.set_floor(0, 0)
    ring.append_batch(0, [25, 31, 33], [b"x", b"y", b"x"])  # 31, 33 applied after the saved 30
    s = ClientSession(start="saved", saved=SAVED, ring=ring)
    reqs = s.handshake("node", 2, INFOS)
    assert reqs == [req(1, 0, 0, 0, 0)]  # partition 0 waits for its repair
    plan = s.repairs[0]
    assert (plan.seqno, plan.keys, plan.reset, plan.reason) == (30, (b"y", b"x"), False, "unsaved_progress")
    assert s.finish_repair(plan, [(b"x", 40)]) == req(0, 3, 30, 25, 35)  # the partial snapshot is kept
    assert [(e.seqno, e.key) for e in ring.entries(0)] == [(25, b"x"), (40, b"x")]
    assert s.repairs == {}


def test_repair_beyond_the_ring_resets_and_reconnects_repair_again():
    ring = RollbackRing(2)
    ring.set_floor(0, 0)
    ring.append_batch(0, [31, 32, 33], [b"a", b"b", b"c"])  # floor 31 > saved 30
    s = ClientSession(start="saved", saved=SAVED, ring=ring)
    s.handshake("node", 2, INFOS)
    plan = s.repairs[0]
    assert plan.reset and plan.keys == ()
    assert s.finish_repair(plan) == req(0, 0, 0, 0, 0)
    assert s.resets == 1 and len(ring.entries(0)) == 0
    ring.append(1, 5, b"q")  # applied on partition 1, above its position 0
    s.connection_lost()
    s.handshake("node", 2, INFOS)
    assert set(s.repairs) == {1} and s.repairs[1].keys == (b"q",)


def test_no_repairs_when_the_ring_is_below_the_positions():
    ring = RollbackRing(100)
    ring.set_floor(0, 0)
    ring.append_batch(0, [10, 30], [b"a", b"b"])
    s = ClientSession(start="saved", saved=SAVED, ring=ring)
    assert len(s.handshake("node", 2, INFOS)) == 2 and s.repairs == {}


def test_too_many_corrections_reset_instead():
    ring = RollbackRing(100)
    s = ClientSession(start="beginning", ring=ring, max_corrections=2)
    s.handshake("node", 2, INFOS)
    ring.append_batch(0, [1, 2, 3], [b"a", b"b", b"c"])
    assert s.plan_rollback(0, 1, "diverged", "", ()).keys == (b"b", b"c")
    assert s.plan_rollback(0, 0, "purged", "", ()).reset


def test_whole_snapshot_state_saves_the_last_complete_snapshot():
    s = ClientSession(start="beginning")
    s.handshake("node", 2, INFOS)
    s.stream_ok(0, INFOS[0].log)
    pos = s.positions[0]
    pos.snapshot_marker(1, 10)
    pos.items(3, 10)
    pos.snapshot_end()
    pos.snapshot_marker(11, 20)
    pos.item(14)
    assert s.state().partitions[0].offset == StreamOffset(7, 14, 11, 20)
    assert s.state(whole_snapshots=True).partitions[0].offset == StreamOffset(7, 10, 1, 10)
