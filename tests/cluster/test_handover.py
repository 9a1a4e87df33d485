"""Graceful failover's pure decisions (``engine.cluster.handover``), as scenarios read against its
table: which partitions start, which replica, what calls a handover off, when the map switches,
when a request is done or refused."""
from __future__ import annotations

import pytest

from engine.cluster.handover import Handover, HandoverRequest, HandoverView, Step, advance, switch_by_source, takes_over
from engine.cluster.partition_map import PartitionMap, Placement
from engine.cluster.promotion import ReplicaProgress

MAP = PartitionMap(7, (
    Placement("a", ("b",)),
    Placement("b", ("c",)),
    Placement("a", ("c",)),
    Placement("c", ("a",)),
    Placement("a", ("b", "c")),
))
LIVE = frozenset({"a", "b", "c"})
IN_SYNC = {(0, "b"): ReplicaProgress(50, True), (2, "c"): ReplicaProgress(70, True),
           (4, "b"): ReplicaProgress(30, True), (4, "c"): ReplicaProgress(31, True),
           (1, "c"): ReplicaProgress(9, True), (3, "a"): ReplicaProgress(9, True)}


def view(requests=None, handovers=(), progress=None, live=LIVE, current=MAP, max_parallel=4) -> HandoverView:
    return HandoverView(current, frozenset(live), IN_SYNC if progress is None else progress,
                        {r.node: r for r in (requests or [])}, {h.partition: h for h in handovers},
                        max_parallel=max_parallel)


A = HandoverRequest("a")


def test_nothing_asked_nothing_done() -> None:
    assert advance(view()) == Step(based_on=7)


def test_a_request_starts_every_active_partition_of_the_node_to_its_best_in_sync_replica() -> None:
    step = advance(view([A]))
    assert step.start == (Handover(0, "a", "b"), Handover(2, "a", "c"), Handover(4, "a", "c"))  # 4: c holds more
    assert step.new_map is None and not step.refuse and not step.done


def test_at_most_max_parallel_partitions_pause_at_once_in_ascending_order() -> None:
    step = advance(view([A], max_parallel=2))
    assert [h.partition for h in step.start] == [0, 2]
    step = advance(view([A], handovers=[Handover(0, "a", "b", 40)], max_parallel=2))
    assert [h.partition for h in step.start] == [2]


@pytest.mark.parametrize(("request_", "live", "progress", "reason"), [
    (HandoverRequest("zz"), LIVE, None, "unknown node 'zz'"),
    (A, {"b", "c"}, None, "node a is down"),
    (A, LIVE, {**IN_SYNC, (2, "c"): ReplicaProgress(60, False)},
     "partition 2: no replica is in sync (c is catching up at seqno 60); --force waits"),
    (A, {"a", "b"}, None, "partition 2: no replica is alive"),
    (A, LIVE, {k: v for k, v in IN_SYNC.items() if k != (0, "b")}, "partition 0: no live replica has reported"),
])
def test_refusals_name_the_reason_and_start_nothing(request_, live, progress, reason) -> None:
    step = advance(view([request_], live=live, progress=progress))
    assert not step.start and len(step.refuse) == 1 and step.refuse[0][0] == request_.node
    assert reason in step.refuse[0][1], step.refuse


def test_force_hands_over_to_a_catching_up_replica() -> None:
    progress = {**IN_SYNC, (2, "c"): ReplicaProgress(60, False)}
    step = advance(view([HandoverRequest("a", force=True)], progress=progress))
    assert Handover(2, "a", "c") in step.start and not step.refuse


def test_a_refused_request_waits_for_the_operator() -> None:
    assert advance(view([HandoverRequest("a", refused="no")])) == Step(based_on=7)


def test_the_map_switches_once_the_target_holds_everything_the_source_gave_out() -> None:
    waiting = [Handover(0, "a", "b"), Handover(2, "a", "c", 71), Handover(4, "a", "c", 31)]
    step = advance(view([A], handovers=waiting))
    assert step.switched == (Handover(4, "a", "c", 31),)  # 0 not fenced yet, 2's target is at 70 < 71
    assert step.new_map is not None and step.new_map.revision == 8 and step.based_on == 7
    assert step.new_map.placements[4] == Placement("c", ("a", "b"))
    assert step.new_map.placements[:4] == MAP.placements[:4]
    assert not step.start and not step.cancel


def test_after_the_switch_the_record_waits_for_the_target_and_the_request_for_the_record() -> None:
    switched = PartitionMap(8, (Placement("b", ("a",)), *MAP.placements[1:3], MAP.placements[3],
                                Placement("c", ("a", "b"))))
    only_2_left = advance(view([A], handovers=[Handover(0, "a", "b", 50)], current=switched))
    assert only_2_left.start == (Handover(2, "a", "c"),) and not only_2_left.forget and not only_2_left.done
    emptied = PartitionMap(9, (switched.placements[0], MAP.placements[1], Placement("c", ("a",)),
                               *switched.placements[3:]))
    assert advance(view([A], handovers=[Handover(0, "a", "b", 50)], current=emptied)).done == ()
    assert advance(view([A], current=emptied)).done == ("a",)
    gone = advance(view([A], handovers=[Handover(0, "a", "b", 50)], current=emptied, live={"a", "c"}))
    assert gone.forget == (Handover(0, "a", "b", 50),)


@pytest.mark.parametrize(("requests", "live", "current", "reason"), [
    ([], LIVE, MAP, "the request was withdrawn"),
    ([HandoverRequest("a", refused="x")], LIVE, MAP, "the request was withdrawn"),
    ([A], {"a", "c"}, MAP, "target node b left the cluster"),
    ([A], LIVE, PartitionMap(8, (Placement("a", ("c",)), *MAP.placements[1:])), "no longer a replica"),
])
def test_a_handover_is_called_off_before_its_switch(requests, live, current, reason) -> None:
    h = Handover(0, "a", "b", 50)
    step = advance(view(requests, handovers=[h], live=live, current=current))
    assert step.cancel and step.cancel[0][0] == h and reason in step.cancel[0][1]
    assert step.new_map is None


def test_a_record_whose_partition_moved_some_other_way_is_forgotten() -> None:
    moved = PartitionMap(8, (Placement("c", ()), *MAP.placements[1:]))
    assert advance(view([A], handovers=[Handover(0, "a", "b", 50)], current=moved)).forget == (
        Handover(0, "a", "b", 50),)


@pytest.mark.parametrize(("handover", "node", "complete", "expected"), [
    (Handover(0, "a", "b", 50), "b", 50, True),
    (Handover(0, "a", "b", 50), "b", 49, False),   # missing writes: that is a failover
    (Handover(0, "a", "b"), "b", 50, False),       # never fenced
    (Handover(0, "a", "b", 50), "c", 50, False),   # not its target
    (None, "b", 50, False),
])
def test_take_over_only_with_the_whole_history(handover, node, complete, expected) -> None:
    assert takes_over(handover, node, complete) is expected


def test_records_round_trip_as_json() -> None:
    for h in (Handover(3, "a", "b"), Handover(3, "a", "b", 9)):
        assert Handover.from_json(h.to_json()) == h
    for r in (HandoverRequest("a"), HandoverRequest("a", True, "because")):
        assert HandoverRequest.from_json(r.to_json()) == r


@pytest.mark.parametrize(("record", "reported", "switches"), [
    (Handover(0, "a", "b", 40), 39, False),
    (Handover(0, "a", "b", 40), 40, True),
    (Handover(0, "a", "b", 40, acked=40), None, True),  # the source saw the target acknowledge it
    (Handover(0, "a", "b", 40, acked=39), 39, False),
    (Handover(0, "a", "b", None, acked=50), 50, False),  # not fenced yet: nothing to catch up with
])
def test_the_switch_needs_the_fenced_seqno_reported_or_acknowledged(record, reported, switches) -> None:
    progress = {**IN_SYNC, (0, "b"): ReplicaProgress(reported, True)} if reported is not None else \
        {k: v for k, v in IN_SYNC.items() if k != (0, "b")}
    step = advance(view([A], handovers=[record], progress=progress))
    assert (step.switched == (record,)) is switches


@pytest.mark.parametrize("record, node, switches", [
    (Handover(0, "a", "b", 10, acked=10), "a", True),
    (Handover(0, "a", "b", 10, acked=12), "a", True),
    (Handover(0, "a", "b", 10, acked=9), "a", False),     # the target lacks the last items
    (Handover(0, "a", "b", 10), "a", False),              # no acknowledgement: the orchestrator waits for the report
    (Handover(0, "a", "b", None, acked=10), "a", False),  # not fenced
    (Handover(0, "a", "b", 10, acked=10), "b", False),    # only the source switches
    (Handover(0, "a", "c", 10, acked=10), "a", False),    # the target is no replica of the partition
    (Handover(1, "a", "b", 10, acked=10), "a", False),    # the map has another node active
])
def test_the_source_switches_only_its_own_acknowledged_handover(record: Handover, node: str, switches: bool) -> None:
    current = PartitionMap(4, (Placement("a", ("b",)), Placement("b", ("a",))))
    new = switch_by_source(current, record, node)
    if not switches:
        assert new is None
        return
    assert new is not None and new.revision == 5
    assert new.placements[0] == Placement("b", ("a",)) and new.placements[1] == current.placements[1]
