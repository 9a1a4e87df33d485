"""One orchestrator step: what the cluster looks like now -> what to change.

The driver (the elected orchestrator's loop) observes the live nodes (their leases), the map
at its revision and each replica's reported progress, calls ``step`` and carries out the
``Decision``: it sets the promoted replicas active (each adds its failover entry), then
publishes ``new_map`` in a transaction that succeeds only if the stored map still has
``based_on``.  If the transaction fails, another orchestrator won; the driver observes again.

Order of concerns in one step:

1. a brand-new cluster (revision 0, no partition placed) gets its first map once
   ``initial_nodes`` nodes are live;
2. a partition whose active node is gone gets a successor (``promotion``), or stays with its
   dead active and is reported unavailable: when that node comes back it still has the data,
   which an empty new active would not.  The old active keeps a slot as a (dead, out of sync)
   replica of the partition it lost;
3. copies on gone nodes are dropped and missing replicas added (``placement``, no moves), but
   a node gone for less than ``replace_after_s`` keeps its replica slots: when it restarts it
   streams from the active, rolls back what the failover took from it, and is in sync again
   without a full copy being streamed to some other node meanwhile (Kafka keeps a dead broker's
   assignments until an operator reassigns them; Couchbase keeps a down node's vBuckets until it
   is failed over).  Only after the grace is a gone node's slot filled on a live node.

How long a node has been gone is the driver's observation (``gone_since``, on its own clock,
``now``), not etcd's: a lease only says whether a node is live.  A node missing from
``gone_since`` counts as gone just now, so a newly elected orchestrator that never saw a node
leave gives it the whole grace again rather than none.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.cluster.partition_map import PartitionMap, Placement
from engine.cluster.placement import place
from engine.cluster.promotion import Promote, ReplicaProgress, Unavailable, choose_successor


@dataclass(frozen=True, slots=True)
class ClusterView:
    map: PartitionMap
    live_nodes: frozenset[str]
    replicas: int
    #: (partition, node) -> what that replica last reported.
    progress: Mapping[tuple[int, str], ReplicaProgress]
    auto_failover: bool = True
    #: live nodes to wait for before the first map, so a cluster started all at once begins
    #: balanced instead of with every active on the node that happened to join first
    initial_nodes: int = 1
    #: node -> when the driver first saw it gone (its clock); ``now`` is the same clock
    gone_since: Mapping[str, float] = field(default_factory=dict)
    now: float = 0.0
    #: how long a gone node's replica slots are kept before they are filled elsewhere
    replace_after_s: float = 0.0
    #: partitions a rebalance is moving (``engine.cluster.rebalance``): left as they are while
    #: every node holding them is live, or this step would trim the copy being built
    hold: frozenset[int] = frozenset()
    #: live nodes being or having been removed: no new copy is placed on them
    excluded: frozenset[str] = frozenset()

    def kept_nodes(self) -> frozenset[str]:
        """Gone nodes still within the grace: their slots stay in the map."""
        gone = self.map.nodes() - self.live_nodes
        return frozenset(n for n in gone if self.now - self.gone_since.get(n, self.now) < self.replace_after_s)


@dataclass(frozen=True, slots=True)
class Decision:
    promotions: tuple[Promote, ...] = ()
    unavailable: tuple[Unavailable, ...] = ()
    #: the map to publish, guarded by ``based_on``; None when nothing changes.
    new_map: PartitionMap | None = None
    based_on: int = 0


def step(view: ClusterView) -> Decision:
    current = view.map
    if not view.live_nodes:
        return Decision(based_on=current.revision)
    if _never_placed(current):
        if len(view.live_nodes) < view.initial_nodes:
            return Decision(based_on=current.revision)
        placements = place(current.placements, view.live_nodes, view.replicas, create=True)
        return Decision(new_map=current.succeeded_by(placements), based_on=current.revision)

    placements = list(current.placements)
    promotions: list[Promote] = []
    unavailable: list[Unavailable] = []
    for p, placement in enumerate(current.placements):
        if placement.active is None or placement.active in view.live_nodes:
            continue
        choice = _successor(p, placement, view)
        if isinstance(choice, Promote):
            promotions.append(choice)
            # the old active stays as a replica: if it comes back in time it resyncs from here
            others = tuple(r for r in placement.replicas if r != choice.node)
            placements[p] = Placement(choice.node, (*others, placement.active))
        else:
            unavailable.append(choice)

    placed = list(place(placements, view.live_nodes, view.replicas, keep=view.kept_nodes()))
    if view.excluded:
        # no new copy on a node being removed; a copy it still holds stays until a rebalance
        # moves it (dropping an active there would leave its partition without one)
        narrowed = place(placements, view.live_nodes - view.excluded, view.replicas, keep=view.kept_nodes())
        for p, placement in enumerate(placements):
            if not any(n in view.excluded for n in placement.nodes):
                placed[p] = narrowed[p]
    for p in view.hold:
        if 0 <= p < len(placed) and all(n in view.live_nodes for n in current.placements[p].nodes):
            placed[p] = placements[p]
    for gone in unavailable:
        # Keep the dead active in the map: it holds the data and may come back.
        placed[gone.partition] = Placement(current.placements[gone.partition].active, placed[gone.partition].replicas)

    changed = tuple(placed) != current.placements
    return Decision(
        promotions=tuple(promotions),
        unavailable=tuple(unavailable),
        new_map=current.succeeded_by(placed) if changed else None,
        based_on=current.revision,
    )


def _never_placed(current: PartitionMap) -> bool:
    return current.revision == 0 and all(not placement.nodes for placement in current.placements)


def _successor(partition: int, placement: Placement, view: ClusterView) -> Promote | Unavailable:
    if not view.auto_failover:
        return Unavailable(partition, f"active node {placement.active} is gone and auto-failover is off")
    progress = {
        node: view.progress[(partition, node)] for node in placement.replicas if (partition, node) in view.progress
    }
    return choose_successor(partition, placement, progress, view.live_nodes)


