"""Graceful failover: hand a live node's active partitions to their replicas without losing a write.

Couchbase's graceful failover (and its rebalance's takeover stream, kv_engine
``docs/dcp/documentation/rebalance.md``), Kafka's controlled shutdown: the old active stops
taking writes, the chosen replica receives everything up to the old active's high seqno, and
only then does the map make it active.  Because the new active holds the whole history, it
takes over keeping the failover log as it is (``Engine.take_over``, no new entry: this is not
a fork, as kv_engine's ``continueToActive`` decides for transfers), so no consumer is told to
roll back, and the old node stays on as a replica of the same history.

Theory of operation.  An operator's ``HandoverRequest`` for a node is stored in etcd; each
cycle the orchestrator calls ``advance`` with what it observed and carries out the ``Step``.
Per partition a ``Handover`` record walks through:

=====================  ======================  =============================================
record                 who moves it            next
=====================  ======================  =============================================
created, not fenced    orchestrator (start)    the source node stops writes
                                               (``Engine.stop_writes``) and records the
                                               seqno it stopped at (``fenced_at``)
fenced at S            source node             once the target reports a whole snapshot up
                                               to S, the orchestrator publishes a map with
                                               the target active and the source a replica;
                                               when the target's stream acknowledged S
                                               already, the source publishes that map in the
                                               transaction that records S
map names the target   orchestrator (switch),  the target follows the map with ``take_over``
                       or the source itself    (not a promotion) and deletes the record
                       (``switch_by_source``)
=====================  ======================  =============================================

Before the switch a handover is called off (the record deleted; the source takes writes again)
when its request is gone (cancelled, timed out), the source or the target left, or the target
stopped being a replica of the partition.  After the switch nothing is called off: the map is
already the truth and the target has everything.

Which replica: the in-sync replica with the highest reported seqno (``promotion``'s rule, the
leaving node excluded).  A partition with no in-sync replica refuses the whole request with the
reason, unless it is forced: then the best live replica is used and the source's writes stay
paused until it catches up (nothing is lost either way; forcing trades a longer pause for
progress).  Order: partitions in ascending order, at most ``max_parallel`` paused at a time
across the cluster, so a handover never stops every partition's writes at once.

Pure: tested with tables in tests/cluster/test_handover.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.cluster.partition_map import PartitionMap, Placement
from engine.cluster.promotion import Promote, ReplicaProgress, choose_successor

__all__ = ["HandoverRequest", "Handover", "HandoverView", "Step", "advance", "switch_by_source",
           "switched_placement", "takes_over"]


@dataclass(frozen=True, slots=True)
class HandoverRequest:
    """An operator asked that ``node`` be active for nothing.  ``refused`` is the orchestrator's
    answer when it cannot be done (the request then waits for the operator to remove it)."""

    node: str
    force: bool = False
    refused: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "force": self.force, "refused": self.refused}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HandoverRequest:
        refused = data.get("refused")
        return cls(str(data["node"]), bool(data.get("force", False)), str(refused) if refused else None)


@dataclass(frozen=True, slots=True)
class Handover:
    """One partition on its way from ``source`` to ``target``."""

    partition: int
    source: str
    target: str
    #: the source's high seqno when it stopped taking writes; None until it has
    fenced_at: int | None = None
    #: whose record: a graceful failover's or a rebalance's (``engine.cluster.rebalance``); each
    #: driver advances only its own, the nodes carry out both alike
    kind: str = "failover"
    #: what the source saw the target acknowledge holding (its stream's ``seqno_ack``) when it
    #: recorded ``fenced_at``: at or past it, the switch need not wait for the target's progress
    #: report in etcd (published every few hundred ms), which would lengthen the write pause
    acked: int | None = None

    def fenced(self, seqno: int, acked: int | None = None) -> Handover:
        return Handover(self.partition, self.source, self.target, seqno, self.kind, acked)

    def caught_up(self, reported: int | None) -> bool:
        """Whether the target holds everything the source gave out: by its own report or by the
        acknowledgement the source recorded."""
        if self.fenced_at is None:
            return False
        return ((reported is not None and reported >= self.fenced_at)
                or (self.acked is not None and self.acked >= self.fenced_at))

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "source": self.source, "target": self.target,
                "fenced_at": self.fenced_at, "kind": self.kind, "acked": self.acked}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Handover:
        fenced, acked = data.get("fenced_at"), data.get("acked")
        return cls(int(data["partition"]), str(data["source"]), str(data["target"]),
                   int(fenced) if fenced is not None else None, str(data.get("kind", "failover")),
                   int(acked) if acked is not None else None)


@dataclass(frozen=True, slots=True)
class HandoverView:
    map: PartitionMap
    live_nodes: frozenset[str]
    #: (partition, node) -> what that replica last reported
    progress: Mapping[tuple[int, str], ReplicaProgress]
    #: node -> the request to empty it of actives
    requests: Mapping[str, HandoverRequest]
    #: partition -> its handover in flight
    handovers: Mapping[int, Handover]
    max_parallel: int = 4


@dataclass(frozen=True, slots=True)
class Step:
    #: records to create: the sources stop writes for these
    start: tuple[Handover, ...] = ()
    #: records to delete before their switch, with why: the sources take writes again
    cancel: tuple[tuple[Handover, str], ...] = ()
    #: the map with every switch of this step, guarded by ``based_on``; None when none
    new_map: PartitionMap | None = None
    based_on: int = 0
    switched: tuple[Handover, ...] = ()
    #: records past their switch whose target is gone: nothing left to do for them
    forget: tuple[Handover, ...] = ()
    #: requests that are done (their node is active for nothing): delete them
    done: tuple[str, ...] = ()
    #: requests that cannot be done, with the reason to store in them
    refuse: tuple[tuple[str, str], ...] = ()


def advance(view: HandoverView) -> Step:
    """One orchestrator cycle of every handover in flight and every pending request."""
    current = view.map
    live = view.live_nodes
    cancel: list[tuple[Handover, str]] = []
    forget: list[Handover] = []
    switched: list[Handover] = []
    in_flight: dict[int, Handover] = {}
    for p, h in sorted(view.handovers.items()):
        placement = current.placements[p] if 0 <= p < current.num_partitions else None
        if placement is None or placement.active not in (h.source, h.target):
            forget.append(h)  # the map moved the partition some other way
            continue
        if placement.active == h.target:  # switched: the target takes over and deletes the record
            if h.target not in live:
                forget.append(h)
            else:
                in_flight[p] = h
            continue
        reason = _called_off(h, placement, view)
        if reason is not None:
            cancel.append((h, reason))
            continue
        in_flight[p] = h
        reported = view.progress.get((p, h.target))
        if h.caught_up(reported.seqno if reported is not None else None):
            switched.append(h)

    start: list[Handover] = []
    done: list[str] = []
    refuse: list[tuple[str, str]] = []
    room = view.max_parallel - len(in_flight)
    for node, request in sorted(view.requests.items()):
        if request.refused is not None:
            continue
        problem = _node_problem(node, current, live)
        if problem is not None:
            refuse.append((node, problem))
            continue
        owned = current.active_partitions(node)
        if not owned and not any(h.source == node for h in in_flight.values()):
            done.append(node)
            continue
        pending = [p for p in owned if p not in in_flight]
        targets: list[Handover] = []
        reasons: list[str] = []
        for p in pending:
            target = _target(p, current.placements[p], _progress_of(view, p), live - {node}, request.force)
            if isinstance(target, str):
                reasons.append(f"partition {p}: {target}")
            else:
                targets.append(Handover(p, node, target.node))
        if reasons:
            refuse.append((node, "; ".join(reasons)))
            continue
        take = targets[:max(room, 0)]
        start.extend(take)
        room -= len(take)

    new_map = None
    if switched:
        placements = list(current.placements)
        for h in switched:
            placements[h.partition] = switched_placement(placements[h.partition], h)
        new_map = current.succeeded_by(placements)
    return Step(start=tuple(start), cancel=tuple(cancel), new_map=new_map, based_on=current.revision,
                switched=tuple(switched), forget=tuple(forget), done=tuple(done), refuse=tuple(refuse))


def switched_placement(placement: Placement, handover: Handover) -> Placement:
    """The target active, the source first among the replicas (it holds the same history)."""
    others = tuple(r for r in placement.replicas if r not in (handover.target, handover.source))
    return Placement(handover.target, (handover.source, *others))


def switch_by_source(current: PartitionMap, handover: Handover, node: str) -> PartitionMap | None:
    """The map a handover's source may publish itself, in the same transaction that records its
    fence (guarded by the map's and the record's etcd revisions), once the target acknowledged
    every item up to ``fenced_at``: the orchestrator would publish the very same switch, one
    watch wake-up and one cycle of reads later, and the write pause pays for each.  None when
    the map no longer has ``node`` active with the target among its replicas (the record is
    then the orchestrator's to settle)."""
    p = handover.partition
    if (handover.source != node or handover.fenced_at is None or handover.acked is None
            or handover.acked < handover.fenced_at or not 0 <= p < current.num_partitions):
        return None
    placement = current.placements[p]
    if placement.active != node or handover.target not in placement.replicas:
        return None
    placements = list(current.placements)
    placements[p] = switched_placement(placement, handover)
    return current.succeeded_by(placements)


def takes_over(handover: Handover | None, node: str, complete_seqno: int) -> bool:
    """Whether ``node``, told by the map to become active, does it as a handover's target
    (``take_over``: same history, no new failover entry) rather than as a failover (``promote``):
    only when the record names it and it holds, whole, everything the source gave out."""
    return (handover is not None and handover.target == node and handover.fenced_at is not None
            and complete_seqno >= handover.fenced_at)


def _target(partition: int, placement: Placement, progress: Mapping[str, ReplicaProgress],
            candidates: frozenset[str], force: bool) -> Promote | str:
    """The replica to hand ``partition`` to, or why there is none."""
    choice = choose_successor(partition, placement, progress, candidates, force=force)
    if isinstance(choice, Promote):
        return choice
    forced = choose_successor(partition, placement, progress, candidates, force=True)
    if isinstance(forced, Promote):  # only not in sync: say so, and what forcing would do
        return (f"no replica is in sync ({forced.node} is catching up at seqno {progress[forced.node].seqno}); "
                f"--force waits for it to catch up with writes paused")
    return choice.reason


def _called_off(h: Handover, placement: Placement, view: HandoverView) -> str | None:
    request = view.requests.get(h.source)
    if request is None or request.refused is not None:
        return "the request was withdrawn"
    if h.source not in view.live_nodes:
        return f"node {h.source} left the cluster"
    if h.target not in view.live_nodes:
        return f"target node {h.target} left the cluster"
    if h.target not in placement.replicas:
        return f"node {h.target} is no longer a replica of partition {h.partition}"
    return None


def _node_problem(node: str, current: PartitionMap, live: frozenset[str]) -> str | None:
    if node not in live and node not in current.nodes():
        return f"unknown node {node!r}: it is neither up nor named by the map"
    if node not in live:
        return f"node {node} is down: automatic failover moves its partitions, not a graceful one"
    return None


def _progress_of(view: HandoverView, partition: int) -> dict[str, ReplicaProgress]:
    return {node: prog for (p, node), prog in view.progress.items() if p == partition}
