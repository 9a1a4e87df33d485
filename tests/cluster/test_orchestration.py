"""One orchestrator step, as scenarios: a new cluster, a node dies, a replica is catching up,
auto-failover off, a node comes back."""
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
