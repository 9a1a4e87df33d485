"""One orchestrator step, as scenarios: a new cluster, a node dies, a replica is catching up,
auto-failover off, a node comes back."""
import pytest

from engine.cluster.orchestration import ClusterView, step
from engine.cluster.partition_map import PartitionMap, Placement
from engine.cluster.promotion import Promote, ReplicaProgress


def _view(m: PartitionMap, live: set[str], progress=None, replicas: int = 1, auto: bool = True) -> ClusterView:
    return ClusterView(m, frozenset(live), replicas, progress or {}, auto_failover=auto)


MAP = PartitionMap(
    4,
    (
        Placement("a", ("b",)),
        Placement("b", ("c",)),
        Placement("c", ("a",)),
        Placement("a", ("c",)),
    ),
)


def test_a_new_cluster_gets_its_first_map_at_revision_1() -> None:
    decision = step(_view(PartitionMap.empty(6), {"a", "b", "c"}))
    assert decision.new_map is not None and decision.new_map.revision == 1 and decision.based_on == 0
    assert all(p.active and len(p.replicas) == 1 for p in decision.new_map.placements)


def test_a_new_cluster_waits_for_its_initial_nodes() -> None:
    view = ClusterView(PartitionMap.empty(6), frozenset({"a", "b"}), 1, {}, initial_nodes=3)
    assert step(view).new_map is None
    view = ClusterView(PartitionMap.empty(6), frozenset({"a", "b", "c"}), 1, {}, initial_nodes=3)
    first = step(view).new_map
    assert first is not None and {p.active for p in first.placements} == {"a", "b", "c"}


def test_a_healthy_cluster_changes_nothing() -> None:
    decision = step(_view(MAP, {"a", "b", "c"}))
    assert decision.new_map is None and decision.promotions == ()


def test_a_dead_node_s_partitions_go_to_their_in_sync_replicas_and_get_new_replicas() -> None:
    progress = {(0, "b"): ReplicaProgress(120, True), (3, "c"): ReplicaProgress(80, True)}
    decision = step(_view(MAP, {"b", "c"}, progress))
    assert decision.promotions == (Promote(0, "b", 120), Promote(3, "c", 80))
    new = decision.new_map
    assert new is not None and new.revision == 5 and decision.based_on == 4
    assert new.placements[0] == Placement("b", ("c",))
    assert new.placements[3] == Placement("c", ("b",))
    assert new.placements[2] == Placement("c", ("b",))  # lost its replica on a, got one on b
    assert "a" not in new.nodes()


def test_a_partition_whose_replica_is_catching_up_keeps_its_dead_active_and_is_reported() -> None:
    progress = {(0, "b"): ReplicaProgress(120, False), (3, "c"): ReplicaProgress(80, True)}
    decision = step(_view(MAP, {"b", "c"}, progress))
    assert [p.partition for p in decision.promotions] == [3]
    assert [u.partition for u in decision.unavailable] == [0]
    assert decision.new_map is not None and decision.new_map.placements[0].active == "a"


def test_with_auto_failover_off_nothing_is_promoted() -> None:
    progress = {(0, "b"): ReplicaProgress(120, True)}
    decision = step(_view(MAP, {"b", "c"}, progress, auto=False))
    assert decision.promotions == ()
    assert {u.partition for u in decision.unavailable} == {0, 3}
    assert all("auto-failover is off" in u.reason for u in decision.unavailable)


def test_a_node_that_comes_back_after_failover_rejoins_as_a_replica_only() -> None:
    progress = {(0, "b"): ReplicaProgress(120, True), (3, "c"): ReplicaProgress(80, True)}
    after_failover = step(_view(MAP, {"b", "c"}, progress)).new_map
    assert after_failover is not None
    back = step(_view(after_failover, {"a", "b", "c"}, replicas=2)).new_map
    assert back is not None
    assert [p.active for p in back.placements] == [p.active for p in after_failover.placements]
    assert all("a" in p.replicas for p in back.placements)


def test_no_live_node_means_no_decision() -> None:
    assert step(_view(MAP, set())).new_map is None


# ---------------------------------------------------------------- a gone node's slots and the grace
GRACE = 60.0
A_GONE_AT = 100.0
IN_SYNC = {(0, "b"): ReplicaProgress(120, True), (3, "c"): ReplicaProgress(80, True)}
#: MAP after a's failover within the grace: a keeps a (dead) replica slot everywhere it had a copy
AFTER_FAILOVER = (Placement("b", ("a",)), Placement("b", ("c",)), Placement("c", ("a",)), Placement("c", ("a",)))
#: the same once the grace is over: a's slots are filled on the live nodes
A_REPLACED = (Placement("b", ("c",)), Placement("b", ("c",)), Placement("c", ("b",)), Placement("c", ("b",)))


def _timed(m: PartitionMap, live: set[str], now: float, gone_since: dict[str, float] | None = None,
           progress=None) -> ClusterView:
    return ClusterView(m, frozenset(live), 1, progress or {}, gone_since=gone_since or {}, now=now,
                       replace_after_s=GRACE)


@pytest.mark.parametrize(
    ("start", "live", "now", "gone_since", "placements", "promoted"),
    [
        # a just died: its actives move to their in-sync replicas and a keeps a slot in each
        (MAP.placements, {"b", "c"}, A_GONE_AT, {"a": A_GONE_AT}, AFTER_FAILOVER, [(0, "b"), (3, "c")]),
        # inside the grace nothing changes: no copy streams to another node meanwhile
        (AFTER_FAILOVER, {"b", "c"}, A_GONE_AT + GRACE - 1, {"a": A_GONE_AT}, None, []),
        # an orchestrator that never saw a leave (just elected) gives the whole grace again
        (AFTER_FAILOVER, {"b", "c"}, A_GONE_AT + 10 * GRACE, {}, None, []),
        # after the grace the slots go to live nodes
        (AFTER_FAILOVER, {"b", "c"}, A_GONE_AT + GRACE, {"a": A_GONE_AT}, A_REPLACED, []),
        # a back within the grace: it is already the replica of what it held, nothing moves
        (AFTER_FAILOVER, {"a", "b", "c"}, A_GONE_AT + 5, {}, None, []),
        # a back after its slots were replaced: it is a new node, it gets no copy without rebalance
        (A_REPLACED, {"a", "b", "c"}, A_GONE_AT + 2 * GRACE, {}, None, []),
    ],
    ids=["failover-keeps-slot", "within-grace", "new-orchestrator", "grace-over", "back-in-time", "back-late"],
)
def test_a_gone_node_keeps_its_replica_slots_for_the_grace(start, live, now, gone_since, placements,
                                                          promoted) -> None:
    before = PartitionMap(7, tuple(start))
    decision = step(_timed(before, live, now, gone_since, IN_SYNC))
    assert [(p.partition, p.node) for p in decision.promotions] == promoted
    if placements is None:
        assert decision.new_map is None
    else:
        assert decision.new_map is not None and decision.new_map.placements == placements


def test_a_kept_dead_replica_is_never_promoted() -> None:
    # after a's failover b dies too: p0's only other copy is a's dead, out-of-sync slot
    before = PartitionMap(8, AFTER_FAILOVER)
    progress = {(2, "a"): ReplicaProgress(500, True)}  # even a stale report does not make it stand
    decision = step(_timed(before, {"c"}, A_GONE_AT + 1, {"a": A_GONE_AT, "b": A_GONE_AT + 1}, progress))
    assert decision.promotions == ()
    assert {u.partition for u in decision.unavailable} == {0, 1}
    assert all("no replica is alive" in u.reason or "in sync" in u.reason or "reported" in u.reason
               for u in decision.unavailable)
    assert decision.new_map is None or decision.new_map.placements[0] == Placement("b", ("a",))


def test_a_returning_old_active_catching_up_is_not_promoted_when_the_new_active_dies() -> None:
    # a came back (catching up on p0) and b, p0's active, dies: a may not stand until in sync
    before = PartitionMap(8, AFTER_FAILOVER)
    progress = {(0, "a"): ReplicaProgress(40, False)}
    decision = step(_timed(before, {"a", "c"}, A_GONE_AT + 20, {"b": A_GONE_AT + 20}, progress))
    assert 0 not in [p.partition for p in decision.promotions]
    assert 0 in [u.partition for u in decision.unavailable]


def test_a_partition_held_by_a_rebalance_keeps_its_extra_copy_while_its_nodes_are_live() -> None:
    current = PartitionMap(4, (Placement("a", ("b", "c")), Placement("b", ("a", "c"))))
    live = frozenset({"a", "b", "c"})
    progress = {(0, "b"): ReplicaProgress(5, True), (1, "a"): ReplicaProgress(5, True)}
    assert step(ClusterView(current, live, 1, progress)).new_map is not None  # trimmed without a hold
    held = step(ClusterView(current, live, 1, progress, hold=frozenset({0, 1})))
    assert held.new_map is None
    gone = step(ClusterView(current, frozenset({"a", "b"}), 1, progress, hold=frozenset({0, 1})))
    assert gone.new_map is not None and "c" not in gone.new_map.nodes()  # a gone node's copy is not held


def test_an_excluded_node_gets_no_new_copy_but_keeps_what_it_holds() -> None:
    current = PartitionMap(4, (Placement("a", ()), Placement("c", ("a",))))
    live = frozenset({"a", "b", "c"})
    decision = step(ClusterView(current, live, 1, {}, excluded=frozenset({"c"})))
    assert decision.new_map is not None
    assert decision.new_map.placements == (Placement("a", ("b",)), Placement("c", ("a",)))
