"""Rebalance: move partition copies until every node holds its share, without losing a write or
forking a history.

Couchbase's rebalance (kv_engine ``docs/dcp/documentation/rebalance.md``), Kafka's partition
reassignment: a new copy is first built as a replica that streams the partition like any
consumer; only once it is in sync does the active move to it, by the same takeover as graceful
failover (``engine.cluster.handover``: the source stops writes, the target receives the last
items and becomes active keeping the failover log), and only then is the copy no longer wanted
dropped.  So a partition never has fewer in-sync copies than before its move, and never two
actives.

Theory of operation.  The operator's ``RebalanceRequest`` is stored in etcd.  The first cycle
that sees it fixes the plan in it: ``origin`` (the map as it was) and ``target`` (``placement``'s
balanced placements for the live nodes less the ones being removed).  The target is stored, not
recomputed each cycle, because an intermediate map (a partition with an extra copy) would make
``place`` trim the wrong copy.  Then each cycle, per partition whose placement is not yet the
target's, in ascending order and at most ``max_parallel`` in motion at once:

=====================================  ==================================================
the partition now                      step
=====================================  ==================================================
lacks a copy the target wants          the map adds it as a replica (it streams, catching up)
its active is not the target's         once the target's active is an in-sync replica: a
                                       takeover record (``Handover``, ``kind="rebalance"``);
                                       once the source stopped writes at S and the target
                                       reports S, the map switches (the source stays replica)
active and copies as wanted, plus      once every copy the target wants is in sync: the map
extras                                 becomes the target's placement (extras dropped)
=====================================  ==================================================

Stopping (``stopped``): takeovers not yet switched are called off (their source takes writes
again); a partition whose active already moved is finished (its extras trimmed once the
target's copies are in sync); elsewhere the copies the rebalance added are dropped.  Once
nothing is in motion the request is deleted; running it again plans afresh from the map as it
then is, so what moved stays moved: that is resuming.  A node that goes down, or a partition
that loses its active, pauses the moves (``waiting`` says why; takeovers not yet switched are
called off) until the cluster is whole again: a lease lost under load comes back in seconds, and
the partitions of a node really gone are failover's business (the plan itself waits the same
way).  A rebalance is refused only when it can never be planned (no map yet, an unknown node to
remove, no node left).

``hold``: partitions whose placement belongs to the rebalance right now; the orchestrator's own
step (``orchestration.step``) leaves them as they are, or it would trim a copy being built.

Pure: tested with tables and properties in tests/cluster/test_rebalance.py.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.cluster.handover import Handover, switched_placement
from engine.cluster.partition_map import PartitionMap, Placement, placement_from_json
from engine.cluster.placement import place
from engine.cluster.promotion import ReplicaProgress

__all__ = ["REBALANCE", "RebalanceRequest", "RebalanceView", "RebalanceStep", "advance", "plan_target",
           "moves_left", "unplaced_nodes"]

#: the ``Handover.kind`` of a rebalance's takeover records
REBALANCE = "rebalance"


@dataclass(frozen=True, slots=True)
class RebalanceRequest:
    """The operator's rebalance and, once planned, its plan.  ``eject``: nodes to empty (remove)."""

    eject: tuple[str, ...] = ()
    stopped: bool = False
    refused: str | None = None
    origin: tuple[Placement, ...] | None = None
    target: tuple[Placement, ...] | None = None
    #: partitions the plan moves (placement differs between origin and target)
    total: int = 0
    #: names this run, so whoever started it can tell its outcome from another run's
    id: str = ""
    #: why no move goes on right now (a node down, a partition without active); None: moving
    waiting: str | None = None

    @property
    def planned(self) -> bool:
        return self.target is not None

    def to_json(self) -> dict[str, Any]:
        return {"eject": list(self.eject), "stopped": self.stopped, "refused": self.refused,
                "origin": _placements_json(self.origin), "target": _placements_json(self.target),
                "total": self.total, "id": self.id, "waiting": self.waiting}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RebalanceRequest:
        refused = data.get("refused")
        return cls(tuple(str(n) for n in data.get("eject", ())), bool(data.get("stopped", False)),
                   str(refused) if refused else None, _placements_from_json(data.get("origin")),
                   _placements_from_json(data.get("target")), int(data.get("total", 0)), str(data.get("id", "")),
                   str(data["waiting"]) if data.get("waiting") else None)


@dataclass(frozen=True, slots=True)
class RebalanceView:
    """What one orchestrator cycle observed, the only input ``advance`` decides from (pure)."""
    map: PartitionMap
    live_nodes: frozenset[str]
    replicas: int
    #: (partition, node) -> what that replica last reported
    progress: Mapping[tuple[int, str], ReplicaProgress]
    request: RebalanceRequest | None
    #: partition -> the rebalance's takeover in flight (records of other kinds are not passed)
    handovers: Mapping[int, Handover] = field(default_factory=dict)
    max_parallel: int = 2


@dataclass(frozen=True, slots=True)
class RebalanceStep:
    """What one cycle must write: the adapter carries it out in etcd transactions guarded by the
    revisions it was computed from, so a step decided on a stale view changes nothing."""
    #: the request to store in place of the one observed (planned, refused); None: unchanged
    store: RebalanceRequest | None = None
    #: delete the request: done, or stopped and wound down
    finished: bool = False
    #: takeover records to create (the sources stop writes)
    start: tuple[Handover, ...] = ()
    #: records to delete before their switch, with why (the sources take writes again)
    cancel: tuple[tuple[Handover, str], ...] = ()
    #: records with nothing left to do (the map moved the partition some other way)
    forget: tuple[Handover, ...] = ()
    #: the map with every change of this step, guarded by ``based_on``; None when none
    new_map: PartitionMap | None = None
    based_on: int = 0
    switched: tuple[Handover, ...] = ()
    #: partitions the orchestrator's own step must leave as they are
    hold: frozenset[int] = frozenset()


def plan_target(current: PartitionMap, live: frozenset[str], replicas: int,
                eject: Sequence[str] = ()) -> tuple[Placement, ...]:
    """The balanced placements for ``live`` less ``eject``, moving as little as possible.

    A partition whose active is being ejected is first given its best remaining copy as active
    (a replica already holding the data), so that ``place`` never sees it without an active."""
    staying = live - set(eject)
    pre = []
    for placement in current.placements:
        if placement.active is not None and placement.active not in staying:
            heirs = [r for r in placement.replicas if r in staying]
            active = heirs[0] if heirs else None
            pre.append(Placement(active, tuple(r for r in placement.replicas if r != active)))
        else:
            pre.append(placement)
    return place(pre, staying, replicas, rebalance=True, create=True)


def unplaced_nodes(current: PartitionMap, live: frozenset[str], excluded: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Live nodes (not removed) that hold no copy of a placed map: joined and waiting for a
    rebalance (what ``--cluster-auto-rebalance`` starts one for)."""
    if current.revision == 0 or any(p.active is None for p in current.placements):
        return ()
    return tuple(sorted(live - excluded - current.nodes()))


def moves_left(current: PartitionMap, target: Sequence[Placement]) -> tuple[int, ...]:
    """Partitions whose placement is not yet the target's."""
    return tuple(p for p, (now, want) in enumerate(zip(current.placements, target, strict=True)) if now != want)


def advance(view: RebalanceView) -> RebalanceStep:
    """One orchestrator cycle of the rebalance (see the module's table)."""
    current = view.map
    request = view.request
    records = dict(view.handovers)
    if request is None or request.refused is not None:
        return RebalanceStep(cancel=_call_off(records, current, "the rebalance was withdrawn"),
                             based_on=current.revision)
    if not request.planned:
        return _plan(view, request)
    target = request.target
    assert target is not None
    problem = _health_problem(view, target)
    if problem is not None:
        # a node down (a lease lost under load comes back in seconds) pauses the moves rather
        # than failing the run; failover meanwhile acts on the partitions whose nodes are gone
        return RebalanceStep(store=replace(request, waiting=problem) if request.waiting != problem else None,
                             based_on=current.revision, cancel=_call_off(records, current, problem),
                             hold=frozenset(moves_left(current, target)))
    if request.waiting is not None:
        return RebalanceStep(store=replace(request, waiting=None), based_on=current.revision,
                             hold=frozenset(moves_left(current, target)))

    placements = list(current.placements)
    start: list[Handover] = []
    cancel: list[tuple[Handover, str]] = []
    forget: list[Handover] = []
    switched: list[Handover] = []
    for p, h in sorted(records.items()):
        now = current.placements[p]
        if now.active == h.target:  # switched: the target takes over and deletes the record
            if h.target not in view.live_nodes:
                forget.append(h)
            continue
        if now.active != h.source or h.target not in now.replicas:
            forget.append(h)  # the map moved the partition some other way
            del records[p]
            continue
        if request.stopped:
            cancel.append((h, "the rebalance was stopped"))
            del records[p]
            continue
        reported = view.progress.get((p, h.target))
        if h.caught_up(reported.seqno if reported is not None else None):
            switched.append(h)
            placements[p] = switched_placement(placements[p], h)

    origin = request.origin if request.origin is not None else current.placements
    left = list(moves_left(current, target))
    in_motion = [p for p in left if p in records or not _settled(current.placements[p], target[p], origin[p])]
    if request.stopped:
        for p in in_motion:
            if p in records:
                continue  # switched: the target takes over (and deletes the record) first
            placements[p] = _wind_down(current.placements[p], target[p], origin[p], p, view.progress)
        # the request goes only once the wound-down map is published (a later cycle sees it)
        unsettled = frozenset(in_motion) | frozenset(h.partition for h, _ in cancel)
        return _step(current, placements, finished=not unsettled, cancel=cancel, forget=forget,
                     switched=switched, hold=unsettled)

    working = list(in_motion)
    for p in left:
        if len(working) >= view.max_parallel:
            break
        if p not in working:
            working.append(p)
    for p in working:
        if placements[p] != current.placements[p]:
            continue  # switched in this step
        now, want = current.placements[p], target[p]
        missing = [n for n in want.nodes if not now.holds(n)]
        if missing:  # build the new copies first: they stream as replicas until in sync
            placements[p] = Placement(now.active, (*now.replicas, *missing))
        elif now.active != want.active:
            if p not in records and _in_sync(view.progress, p, want.active):
                assert now.active is not None and want.active is not None
                start.append(Handover(p, now.active, want.active, kind=REBALANCE))
        elif p not in records and all(_in_sync(view.progress, p, r) for r in want.replicas):
            placements[p] = want  # the wanted copies are in sync: drop the extras
    finished = not left and not records
    return _step(current, placements, finished=finished, start=start, forget=forget, switched=switched,
                 hold=frozenset(left))


def _plan(view: RebalanceView, request: RebalanceRequest) -> RebalanceStep:
    current = view.map
    # nothing else may move while the plan is being fixed: the next cycle acts on it
    hold = frozenset(range(current.num_partitions))
    problem = _planning_problem(view, request)
    if problem is not None:
        return RebalanceStep(store=replace(request, refused=problem), based_on=current.revision)
    if request.stopped:
        return RebalanceStep(finished=True, based_on=current.revision)
    unhealthy = _health_problem(view, ())
    if unhealthy is not None:  # planned once the cluster is whole again
        return RebalanceStep(store=replace(request, waiting=unhealthy) if request.waiting != unhealthy else None,
                             based_on=current.revision, hold=hold)
    target = plan_target(current, view.live_nodes, view.replicas, request.eject)
    planned = replace(request, origin=current.placements, target=target, total=len(moves_left(current, target)),
                      waiting=None)
    return RebalanceStep(store=planned, based_on=current.revision, hold=hold)


def _planning_problem(view: RebalanceView, request: RebalanceRequest) -> str | None:
    current = view.map
    if current.revision == 0:
        return "the cluster has no map yet"
    for node in request.eject:
        if node not in view.live_nodes and node not in current.nodes():
            return f"unknown node {node!r}: it is neither up nor named by the map"
    if not view.live_nodes - set(request.eject):
        return "no node would be left: at least one node must stay"
    return None


def _health_problem(view: RebalanceView, target: Sequence[Placement]) -> str | None:
    wanted = {n for placement in target for n in placement.nodes}
    down = sorted((wanted | view.map.nodes()) - view.live_nodes)
    if down:
        return f"node {', '.join(down)} is down: the moves wait for it (stop the rebalance to give up)"
    homeless = [p for p, placement in enumerate(view.map.placements) if placement.active is None]
    if homeless:
        return f"partition {homeless[0]} has no active node: the moves wait for its failover"
    return None


def _settled(now: Placement, want: Placement, origin: Placement) -> bool:
    """Not in motion: the partition is where the plan wants it, or holds no copy the rebalance
    added (it has not started, or was wound back)."""
    return now == want or all(origin.holds(n) for n in now.nodes)


def _wind_down(now: Placement, want: Placement, origin: Placement, p: int,
               progress: Mapping[tuple[int, str], ReplicaProgress]) -> Placement:
    """A stopped rebalance's partition: finished if its active already moved (once the wanted
    copies are in sync), else without the copies the rebalance added."""
    if now.active == want.active and now.active != origin.active:
        if all(now.holds(n) for n in want.nodes) and all(_in_sync(progress, p, r) for r in want.replicas):
            return want
        return now
    return Placement(now.active, tuple(r for r in now.replicas if origin.holds(r)))


def _in_sync(progress: Mapping[tuple[int, str], ReplicaProgress], p: int, node: str | None) -> bool:
    reported = progress.get((p, node)) if node is not None else None
    return reported is not None and reported.in_sync


def _call_off(records: Mapping[int, Handover], current: PartitionMap, reason: str) -> tuple[tuple[Handover, str], ...]:
    return tuple((h, reason) for p, h in sorted(records.items()) if current.active_of(p) != h.target)


def _step(current: PartitionMap, placements: list[Placement], *, finished: bool, start: Sequence[Handover] = (),
          cancel: Sequence[tuple[Handover, str]] = (), forget: Sequence[Handover] = (),
          switched: Sequence[Handover] = (), hold: frozenset[int] = frozenset()) -> RebalanceStep:
    changed = tuple(placements) != current.placements
    return RebalanceStep(finished=finished, start=tuple(start), cancel=tuple(cancel), forget=tuple(forget),
                         new_map=current.succeeded_by(placements) if changed else None, based_on=current.revision,
                         switched=tuple(switched), hold=hold)


def _placements_json(placements: tuple[Placement, ...] | None) -> list[dict[str, Any]] | None:
    if placements is None:
        return None
    return [{"partition": p, "active": pl.active, "replicas": list(pl.replicas)} for p, pl in enumerate(placements)]


def _placements_from_json(data: Any) -> tuple[Placement, ...] | None:
    if data is None:
        return None
    return tuple(placement_from_json(i, entry) for i, entry in enumerate(data))
