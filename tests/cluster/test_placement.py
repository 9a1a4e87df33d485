"""Placement: distinct nodes per partition, balanced load, and no needless moves."""
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cluster.partition_map import PartitionMap, Placement, copies_per_node
from engine.cluster.placement import place

NODES = ["n1", "n2", "n3", "n4", "n5"]


def _spread(placements: tuple[Placement, ...], nodes: list[str]) -> tuple[int, int]:
    counts = copies_per_node(placements)
    actives = [counts.get(n, (0, 0))[0] for n in nodes]
    replicas = [counts.get(n, (0, 0))[1] for n in nodes]
    return max(actives) - min(actives), max(replicas) - min(replicas)


def _created(partitions: int, nodes: list[str], replicas: int) -> tuple[Placement, ...]:
    return place(PartitionMap.empty(partitions).placements, nodes, replicas, create=True)


def test_a_new_cluster_spreads_actives_and_replicas_evenly() -> None:
    placements = _created(16, ["a", "b", "c"], 1)
    assert all(p.active is not None and len(p.replicas) == 1 for p in placements)
    assert _spread(placements, ["a", "b", "c"]) == (1, 1)


def test_fewer_nodes_than_copies_places_as_many_replicas_as_fit() -> None:
    placements = _created(4, ["a", "b"], 3)
    assert all(len(p.replicas) == 1 for p in placements)
    placements = _created(4, ["a"], 2)
    assert all(p == Placement("a") for p in placements)


def test_without_rebalance_a_joining_node_gets_only_missing_replicas() -> None:
    before = _created(8, ["a", "b"], 2)  # two nodes: one replica each
    after = place(before, ["a", "b", "c"], 2)
    assert [p.active for p in after] == [p.active for p in before]
    assert all(set(b.replicas) <= set(a.replicas) for a, b in zip(after, before))
    assert all(len(p.replicas) == 2 for p in after)


def test_without_rebalance_copies_on_a_gone_node_are_dropped_and_replaced() -> None:
    before = _created(12, ["a", "b", "c"], 1)
    after = place(before, ["a", "b"], 1)
    assert all("c" not in p.replicas for p in after)
    # actives on the gone node are not replaced here: that is promotion's decision
    assert [p.active for p in after] == [None if p.active == "c" else p.active for p in before]
    assert all(len(p.replicas) == 1 for p in after if p.active is not None)


def test_a_homeless_partition_gets_no_empty_active_unless_the_cluster_is_new() -> None:
    after = place((Placement(None, ("b",)), Placement("a")), ["a", "b", "c"], 1)
    assert after[0] == Placement(None, ("b",))


def test_rebalance_moves_an_active_onto_its_replica_first() -> None:
    before = (Placement("a", ("b",)), Placement("a", ("c",)))
    after = place(before, ["a", "b", "c"], 1, rebalance=True)
    moved = [p for p, (x, y) in enumerate(zip(before, after)) if x.active != y.active]
    assert len(moved) == 1
    p = moved[0]
    assert after[p].active in before[p].replicas and after[p].replicas == ("a",)


def test_placement_is_deterministic() -> None:
    before = _created(32, NODES[:3], 2)
    assert place(before, NODES, 2, rebalance=True) == place(before, list(reversed(NODES)), 2, rebalance=True)


@settings(max_examples=200, deadline=None)
@given(
    partitions=st.integers(1, 64),
    replicas=st.integers(0, 3),
    first=st.integers(1, 5),
    second=st.sets(st.sampled_from(NODES), min_size=1),
)
def test_rebalance_after_any_membership_change_is_balanced_and_complete(
    partitions: int, replicas: int, first: int, second: set[str]
) -> None:
    before = _created(partitions, NODES[:first], replicas)
    survivors = [n for n in sorted(second)]
    # partitions whose active left get a live active first (as a promotion would)
    promoted = tuple(
        p if p.active in second else Placement(min(second), tuple(r for r in p.replicas if r != min(second)))
        for p in before
    )
    after = place(promoted, survivors, replicas, rebalance=True)
    copies = min(replicas, len(survivors) - 1) + 1
    for p in after:
        assert p.active in second
        assert len(p.nodes) == copies
        assert set(p.nodes) <= second
    active_spread, replica_spread = _spread(after, survivors)
    assert active_spread <= 1
    assert replica_spread <= 1


@settings(max_examples=200, deadline=None)
@given(partitions=st.integers(1, 64), replicas=st.integers(0, 3), nodes=st.integers(1, 5))
def test_a_balanced_map_is_left_alone(partitions: int, replicas: int, nodes: int) -> None:
    before = place(_created(partitions, NODES[:nodes], replicas), NODES[:nodes], replicas, rebalance=True)
    assert place(before, NODES[:nodes], replicas, rebalance=True) == before
    assert place(before, NODES[:nodes], replicas) == before


def test_a_kept_gone_node_keeps_its_replica_slots_and_gets_no_new_copy() -> None:
    before = (Placement("a", ("c",)), Placement("b", ("c",)), Placement("c", ("a",)), Placement("a", ("b",)))
    kept = place(before, ["a", "b"], 1, keep=["c"])
    assert kept[0] == Placement("a", ("c",)) and kept[1] == Placement("b", ("c",))
    assert kept[2] == Placement(None, ("a",))  # its active is promotion's business, not placement's
    assert kept[3] == before[3]
    replaced = place(before, ["a", "b"], 1)
    assert replaced[0] == Placement("a", ("b",)) and replaced[1] == Placement("b", ("a",))


def test_a_kept_slot_counts_towards_the_replicas_that_fit() -> None:
    # two nodes, one gone but kept: the live one keeps the kept node as its replica
    assert place((Placement("a", ("b",)),), ["a"], 1, keep=["b"]) == (Placement("a", ("b",)),)
    assert place((Placement("a", ("b",)),), ["a"], 1) == (Placement("a"),)


@settings(max_examples=200, deadline=None)
@given(
    partitions=st.integers(1, 32),
    replicas=st.integers(0, 3),
    nodes=st.integers(2, 5),
    gone=st.sets(st.sampled_from(NODES), min_size=1),
    kept_share=st.floats(0, 1),
)
def test_kept_slots_stay_put_and_no_copy_moves_onto_a_gone_node(
    partitions: int, replicas: int, nodes: int, gone: set[str], kept_share: float
) -> None:
    before = _created(partitions, NODES[:nodes], replicas)
    gone &= set(NODES[:nodes])
    live = [n for n in NODES[:nodes] if n not in gone]
    kept = sorted(gone)[: round(len(gone) * kept_share)]
    after = place(before, live, replicas, keep=kept)
    want = min(replicas, max(len(live) + len(kept) - 1, 0))
    for b, a in zip(before, after):
        assert set(a.nodes) <= set(live) | set(kept)
        assert {n for n in a.replicas if n in kept} <= set(b.replicas)  # a kept node gets nothing new
        if a.active is not None:
            assert len(a.replicas) == min(want, len(set(live) | set(b.replicas) & set(kept)) - 1)
