"""Rebalance's pure planner (``engine.cluster.rebalance``): scenarios read against its table, and
a simulated cluster driven to the end for any map and node set (hypothesis)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cluster.handover import Handover
from engine.cluster.partition_map import PartitionMap, Placement, copies_per_node
from engine.cluster.placement import place
from engine.cluster.promotion import ReplicaProgress
from engine.cluster.rebalance import (REBALANCE, RebalanceRequest, RebalanceStep, RebalanceView, advance,
                                      moves_left, plan_target)

TWO = PartitionMap(5, (Placement("a", ("b",)), Placement("b", ("a",)), Placement("a", ("b",)),
                       Placement("b", ("a",))))
THREE = frozenset({"a", "b", "c"})


def synced(current: PartitionMap) -> dict[tuple[int, str], ReplicaProgress]:
    return {(p, r): ReplicaProgress(10, True) for p, pl in enumerate(current.placements) for r in pl.replicas}


def view(current: PartitionMap, request: RebalanceRequest | None, *, live=THREE, progress=None, handovers=(),
         replicas: int = 1, max_parallel: int = 2) -> RebalanceView:
    return RebalanceView(current, frozenset(live), replicas, synced(current) if progress is None else progress,
                         request, {h.partition: h for h in handovers}, max_parallel)


def planned(current: PartitionMap, live=THREE, eject=()) -> RebalanceRequest:
    step = advance(view(current, RebalanceRequest(eject=tuple(eject)), live=live))
    assert step.store is not None and step.store.planned, step
    return step.store


def test_no_request_nothing_done() -> None:
    assert advance(view(TWO, None)) == RebalanceStep(based_on=5)


def test_the_first_cycle_fixes_the_plan_and_holds_every_partition() -> None:
    step = advance(view(TWO, RebalanceRequest()))
    assert step.store is not None and step.store.origin == TWO.placements
    assert step.store.target == plan_target(TWO, THREE, 1)
    assert step.store.total == len(moves_left(TWO, step.store.target)) > 0
    assert step.hold == frozenset(range(4)) and step.new_map is None and not step.start
    counts = copies_per_node(step.store.target)
    assert counts["c"][0] >= 1 and counts["c"][1] >= 1  # the new node gets actives and replicas


@pytest.mark.parametrize(("current", "live", "eject", "reason"), [
    (PartitionMap.empty(4), THREE, (), "no map yet"),
    (TWO, THREE, ("zz",), "unknown node 'zz'"),
    (PartitionMap(3, (Placement("a"),)), {"a"}, ("a",), "no node would be left"),
])
def test_planning_refusals_name_the_reason(current, live, eject, reason) -> None:
    step = advance(view(current, RebalanceRequest(eject=eject), live=live))
    assert step.store is not None and step.store.refused is not None and reason in step.store.refused
    assert step.new_map is None and not step.start


@pytest.mark.parametrize(("current", "live", "reason"), [
    (TWO, {"a"}, "node b is down"),
    (PartitionMap(3, (Placement(None, ("a",)), Placement("a"))), {"a"}, "partition 0 has no active"),
])
def test_an_unhealthy_cluster_is_planned_once_whole_again(current, live, reason) -> None:
    step = advance(view(current, RebalanceRequest(), live=live))
    assert step.store is not None and step.store.refused is None and reason in (step.store.waiting or "")
    assert not step.store.planned and step.new_map is None and not step.start


def test_a_new_copy_is_built_as_a_replica_before_anything_moves() -> None:
    request = planned(TWO)
    step = advance(view(TWO, request))
    assert step.new_map is not None and not step.start
    for p in step.new_map.changed_partitions(TWO):
        before, after = TWO.placements[p], step.new_map.placements[p]
        assert after.active == before.active and set(before.replicas) < set(after.replicas)  # only added
    assert len(step.new_map.changed_partitions(TWO)) <= 2  # max_parallel


def test_the_takeover_waits_for_the_new_copy_to_be_in_sync_then_starts_a_rebalance_record() -> None:
    current = PartitionMap(6, (Placement("a", ("b", "c")), Placement("b", ("a",))))
    request = RebalanceRequest(origin=(Placement("a", ("b",)), Placement("b", ("a",))),
                               target=(Placement("c", ("a",)), Placement("b", ("a",))), total=1)
    catching_up = {**synced(current), (0, "c"): ReplicaProgress(3, False)}
    assert advance(view(current, request, progress=catching_up)).start == ()
    step = advance(view(current, request))
    assert step.start == (Handover(0, "a", "c", kind=REBALANCE),) and step.new_map is None
    assert step.hold == frozenset({0})


def test_the_map_switches_once_the_target_reports_the_fenced_seqno_then_trims_once_in_sync() -> None:
    current = PartitionMap(6, (Placement("a", ("b", "c")),))
    request = RebalanceRequest(origin=(Placement("a", ("b",)),), target=(Placement("c", ("a",)),), total=1)
    record = Handover(0, "a", "c", 40, REBALANCE)
    behind = {**synced(current), (0, "c"): ReplicaProgress(39, True)}
    assert advance(view(current, request, progress=behind, handovers=[record])).new_map is None
    step = advance(view(current, request, progress={**behind, (0, "c"): ReplicaProgress(40, True)},
                        handovers=[record]))
    assert step.switched == (record,) and step.new_map is not None
    switched = step.new_map
    assert switched.placements[0] == Placement("c", ("a", "b"))
    # the target has not yet deleted its record (taken over): no trim before that
    assert advance(view(switched, request, handovers=[record])).new_map is None
    # a (the old active) has not reported in sync as a replica yet: no trim
    not_yet = {(0, "b"): ReplicaProgress(40, True), (0, "a"): ReplicaProgress(30, False)}
    assert advance(view(switched, request, progress=not_yet)).new_map is None
    final = advance(view(switched, request))
    assert final.new_map is not None and final.new_map.placements[0] == Placement("c", ("a",))
    assert not final.finished
    assert advance(view(final.new_map, request)).finished


@pytest.mark.parametrize(("current", "record", "why"), [
    (PartitionMap(6, (Placement("b", ("a", "c")),)), Handover(0, "a", "c", None, REBALANCE), "moved elsewhere"),
    (PartitionMap(6, (Placement("a", ("b",)),)), Handover(0, "a", "c", None, REBALANCE), "target not a replica"),
])
def test_a_record_the_map_overtook_is_forgotten(current, record, why) -> None:
    request = RebalanceRequest(origin=current.placements, target=(Placement("c", ("a",)),), total=1)
    assert advance(view(current, request, handovers=[record])).forget == (record,), why


def test_a_node_going_down_mid_rebalance_pauses_it_and_calls_the_takeovers_off_until_it_is_back() -> None:
    current = PartitionMap(6, (Placement("a", ("b", "c")), Placement("b", ("a",))))
    request = RebalanceRequest(origin=TWO.placements[:2], target=(Placement("c", ("a",)), Placement("b", ("a",))))
    record = Handover(0, "a", "c", 40, REBALANCE)
    step = advance(view(current, request, live={"a", "b"}, handovers=[record]))
    assert step.store is not None and "node c is down" in (step.store.waiting or "")
    assert step.store.refused is None
    assert [h for h, _ in step.cancel] == [record] and step.new_map is None and not step.start
    assert step.hold == frozenset({0})  # the step itself holds only partitions whose nodes are all live
    waiting = step.store
    assert advance(view(current, waiting, live={"a", "b"})).store is None  # said once
    back = advance(view(current, waiting))
    assert back.store is not None and back.store.waiting is None and back.new_map is None
    assert advance(view(current, back.store)).start == (Handover(0, "a", "c", kind=REBALANCE),)


def test_withdrawn_calls_off_unswitched_records_only() -> None:
    current = PartitionMap(6, (Placement("a", ("c",)), Placement("c", ("b",))))
    pending, switched = Handover(0, "a", "c", 5, REBALANCE), Handover(1, "b", "c", 9, REBALANCE)
    step = advance(view(current, None, handovers=[pending, switched]))
    assert [h for h, _ in step.cancel] == [pending]


def test_stopping_winds_down_to_what_moved_and_drops_the_copies_being_built() -> None:
    origin = (Placement("a", ("b",)), Placement("a", ("b",)), Placement("b", ("a",)))
    target = (Placement("c", ("a",)), Placement("a", ("c",)), Placement("b", ("a",)))
    current = PartitionMap(9, (Placement("c", ("a", "b")),  # switched, trim pending
                               Placement("a", ("b", "c")),  # a copy being built
                               Placement("b", ("a",))))
    stopped = RebalanceRequest(stopped=True, origin=origin, target=target, total=2)
    step = advance(view(current, stopped))
    assert step.new_map is not None
    assert step.new_map.placements == (Placement("c", ("a",)), Placement("a", ("b",)), Placement("b", ("a",)))
    assert not step.finished and step.hold == frozenset({0, 1})
    assert advance(view(step.new_map, stopped)).finished
    record = Handover(1, "a", "c", 3, REBALANCE)  # a takeover not switched yet is called off
    step = advance(view(current, stopped, handovers=[record]))
    assert [h for h, _ in step.cancel] == [record] and not step.finished


def test_ejecting_a_node_moves_its_actives_to_replicas_holding_the_data() -> None:
    three = PartitionMap(4, (Placement("a", ("c",)), Placement("b", ("a",)), Placement("c", ("b",))))
    target = plan_target(three, THREE, 1, eject=("c",))
    assert all("c" not in pl.nodes for pl in target)
    assert target[2].active == "b"  # c's active went to its replica on b: only a takeover, no full copy


# --------------------------------------------------------------------------- the simulated cluster
def simulate(current: PartitionMap, live: frozenset[str], replicas: int, eject=(), max_parallel=2,
             stop_at: int | None = None, lag: int = 1):
    """Drive ``advance`` to the end as the orchestrator and nodes would: new copies report in sync
    ``lag`` cycles after being added, sources fence at once, targets catch up and take over.
    Checks every map on the way; returns the final map and the number of cycles."""
    request: RebalanceRequest | None = RebalanceRequest(eject=tuple(eject))
    records: dict[int, Handover] = {}
    # the copies there at the start are in sync
    added_at = {(p, r): -lag for p, pl in enumerate(current.placements) for r in pl.replicas}
    seqno = 100
    maps = [current]
    for cycle in range(400):
        progress = {}
        for p, pl in enumerate(current.placements):
            for r in pl.replicas:
                added_at.setdefault((p, r), cycle)
                in_sync = cycle - added_at[(p, r)] >= lag
                progress[(p, r)] = ReplicaProgress(seqno if in_sync else 1, in_sync)
        if stop_at is not None and cycle == stop_at and request is not None:
            request = replace(request, stopped=True)
        step = advance(RebalanceView(current, live, replicas, progress, request, records, max_parallel))
        if step.store is not None:
            request = step.store
            assert request.refused is None, request.refused
        for h, _ in step.cancel:
            records.pop(h.partition)
        for h in step.forget:
            records.pop(h.partition, None)
        for h in step.start:
            assert h.partition not in records
            records[h.partition] = h.fenced(seqno)  # the source fences at once
        if step.new_map is not None:
            check_step(current, step.new_map, progress, step.hold, request)
            current = step.new_map
            maps.append(current)
            for p in current.changed_partitions(maps[-2]):  # a copy that left forgets its progress
                for (q, n) in list(added_at):
                    if q == p and not current.placements[p].holds(n):
                        del added_at[(q, n)]
        for p, h in list(records.items()):  # targets take over and delete their records
            if current.active_of(p) == h.target:
                del records[p]
        if step.finished:
            return current, request, cycle
    raise AssertionError("the rebalance did not finish")


def check_step(before: PartitionMap, after: PartitionMap, progress, hold: frozenset[int],
               request: RebalanceRequest) -> None:
    """One published map: only held partitions change, each keeps an active, an active moves only
    to an in-sync replica (the old one staying a replica), and a partition never has fewer
    in-sync copies than at the start (or than the target wants, when it wants fewer)."""
    def in_sync(p: int, n: str, pl: Placement) -> bool:
        # the old active holds everything the new one took over with, reported or not
        return n in (pl.active, before.active_of(p)) or progress.get((p, n), ReplicaProgress(0, False)).in_sync

    for p in after.changed_partitions(before):
        old, new = before.placements[p], after.placements[p]
        assert p in hold, "a partition changed without being held"
        assert new.active is not None
        if old.active != new.active:
            assert new.active in old.replicas and progress[(p, new.active)].in_sync and old.active in new.replicas
        floor = min(len(request.origin[p].nodes), len(request.target[p].nodes))
        assert sum(in_sync(p, n, new) for n in new.nodes) >= floor, (p, old, new)


def balanced(current: PartitionMap, nodes: list[str]) -> bool:
    counts = copies_per_node(current.placements)
    actives = [counts.get(n, (0, 0))[0] for n in nodes]
    replicas = [counts.get(n, (0, 0))[1] for n in nodes]
    return max(actives) - min(actives) <= 1 and max(replicas) - min(replicas) <= 1


def test_two_to_three_to_two_nodes() -> None:
    start = PartitionMap(1, place(PartitionMap.empty(8).placements, ["a", "b"], 1, create=True))
    three, request, _ = simulate(start, THREE, 1)
    assert three.placements == request.target and balanced(three, ["a", "b", "c"])
    two, _, _ = simulate(three, THREE, 1, eject=("c",))
    assert "c" not in two.nodes() and balanced(two, ["a", "b"])


NODES = ["n1", "n2", "n3", "n4", "n5"]


@st.composite
def clusters(draw):
    partitions = draw(st.integers(1, 24))
    replicas = draw(st.integers(0, 2))
    before = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True))
    current = PartitionMap(1, place(PartitionMap.empty(partitions).placements, before, replicas, create=True))
    after = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=5, unique=True))
    eject = [n for n in before if n not in after]  # nodes leaving are removed gracefully
    live = frozenset(before) | frozenset(after)
    return current, live, replicas, eject, draw(st.integers(1, 4)), draw(st.integers(0, 3))


@settings(max_examples=100, deadline=None)
@given(clusters())
def test_any_map_and_node_set_ends_balanced_with_no_copy_lost_on_the_way(case) -> None:
    current, live, replicas, eject, max_parallel, lag = case
    final, request, _ = simulate(current, live, replicas, eject, max_parallel, lag=lag)
    staying = sorted(live - set(eject))
    assert final.placements == request.target
    assert balanced(final, staying) and not (final.nodes() & set(eject))
    want = min(replicas, len(staying) - 1)
    assert all(pl.active is not None and len(pl.replicas) == want for pl in final.placements)


@settings(max_examples=100, deadline=None)
@given(clusters(), st.integers(0, 12))
def test_stopping_at_any_cycle_winds_down_to_a_map_without_copies_in_motion(case, stop_at) -> None:
    current, live, replicas, eject, max_parallel, lag = case
    final, request, _ = simulate(current, live, replicas, eject, max_parallel, stop_at=stop_at, lag=lag)
    if not request.planned:  # stopped before the plan was fixed: nothing moved
        assert final == current
        return
    for p, pl in enumerate(final.placements):
        assert pl == request.target[p] or all(request.origin[p].holds(n) for n in pl.nodes)


def test_a_node_holding_nothing_in_a_placed_map_is_unplaced_unless_removed() -> None:
    from engine.cluster.rebalance import unplaced_nodes

    assert unplaced_nodes(TWO, THREE) == ("c",)
    assert unplaced_nodes(TWO, THREE, frozenset({"c"})) == ()
    assert unplaced_nodes(PartitionMap.empty(4), THREE) == ()  # the first map places everyone
    assert unplaced_nodes(PartitionMap(2, (Placement(None, ("a",)),)), THREE) == ()  # failover first
