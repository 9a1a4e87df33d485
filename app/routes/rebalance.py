"""``/cluster/rebalance``: spread partitions evenly over the live nodes by takeover (``upr cluster
rebalance``), and add or remove a node (``upr cluster add|remove NODE``).

Any node takes the request and stores it in etcd; the orchestrator carries it out
(``engine.cluster.rebalance``) and the command follows its progress with ``GET``.  ``DELETE``
stops it: takeovers not yet switched are called off, copies being built are dropped, what moved
stays moved; posting again resumes from there."""
from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from app.cluster.etcd import EtcdError
from app.cluster.rebalance import progress_of
from app.deps import AdminCtx, ReadCtx
from app.problems import INVALID_INPUT, NOT_FOUND, NOT_READY, Problem, ProblemType
from app.routes.responses import problems
from engine.cluster.rebalance import RebalanceRequest

router = APIRouter(prefix="/cluster/rebalance", tags=["cluster"])

REBALANCE_RUNNING = ProblemType("rebalance-running", 409, "A rebalance is in progress")
NODE_NOT_UP = ProblemType("node-not-up", 409, "Node not up")

_CONFLICT = {409: "a rebalance is already in progress (`DELETE` stops it), or the node to add is not up"}


class RebalanceBody(BaseModel):
    # at most 63 names in all: with the request itself one etcd transaction must stay within etcd's
    # default limit of 128 operations
    remove: list[str] = Field(default_factory=list, max_length=63,
                              description="nodes to empty: every copy they hold moves away, then they are out of "
                                          "the map and may be stopped; they get no new copy until added back")
    add: list[str] = Field(default_factory=list, max_length=63,
                           description="up nodes to take partitions (and to clear of an earlier removal)")


class RebalanceTakeover(BaseModel):
    partition: int
    source: str
    target: str
    fenced_at: int | None = Field(description="the source's high seqno when it stopped taking writes (null: the "
                                              "target is not yet caught up enough to start)")


class RebalanceCopy(BaseModel):
    partition: int
    node: str
    seqno: int | None = Field(description="what the new copy holds so far (null: no report yet)")
    in_sync: bool


class RebalanceRequestInfo(BaseModel):
    id: str
    remove: list[str]
    stopped: bool = Field(description="stopping: moves in flight wind down, then the request goes")
    refused: str | None = Field(description="why the orchestrator cannot plan it (null: in progress)")
    waiting: str | None = Field(description="why no move goes on right now, e.g. a node down (null: moving)")
    planned: bool


class RebalanceStatus(BaseModel):
    request: RebalanceRequestInfo | None = Field(description="the run in progress; null when none")
    total: int | None = Field(description="partitions the plan moves (null: not planned yet)")
    moved: int
    remaining: int | None
    transferred: int = Field(description="items (seqnos) the new copies have received")
    takeovers: list[RebalanceTakeover] = Field(description="partitions whose active is being handed over")
    building: list[RebalanceCopy] = Field(description="new copies not yet trimmed to the plan, with their progress")
    removed: list[str] = Field(description="nodes removed or being removed (no new copy goes there)")
    last: dict[str, Any] | None = Field(description="the outcome of the last run that ended: id, result "
                                                    "(done/stopped), total, moved, transferred")
    map_revision: int


def _cluster(request: Request) -> Any:
    node = getattr(request.app.state, "cluster", None)
    if node is None:
        raise Problem(NOT_FOUND, "this node is not in a cluster (started without --cluster)")
    return node


async def _status(cluster: Any) -> RebalanceStatus:
    store = cluster.rebalance
    try:
        observed, last = await store.observe(), await store.last()
    except EtcdError as exc:
        raise Problem(NOT_READY, f"etcd did not answer: {exc.message}") from None
    current, request = cluster.map, observed.request
    figures = (progress_of(request, current, cluster.progress) if request is not None
               else {"total": None, "moved": 0, "remaining": None, "transferred": 0})
    building = []
    if request is not None and request.target is not None and request.origin is not None:
        for p, (want, before) in enumerate(zip(request.target, request.origin, strict=True)):
            now = current.placements[p]
            for node in want.nodes:
                if not before.holds(node) and node in now.replicas and now != want:
                    reported = cluster.progress.get((p, node))
                    building.append(RebalanceCopy(partition=p, node=node, seqno=reported.seqno if reported else None,
                                                  in_sync=bool(reported and reported.in_sync)))
    return RebalanceStatus(
        request=RebalanceRequestInfo(id=request.id, remove=list(request.eject), stopped=request.stopped,
                                     refused=request.refused, waiting=request.waiting,
                                     planned=request.planned) if request is not None else None,
        **figures,
        takeovers=[RebalanceTakeover(partition=p, source=s.handover.source, target=s.handover.target,
                                     fenced_at=s.handover.fenced_at) for p, s in sorted(observed.records.items())],
        building=building, removed=sorted(observed.ejected), last=last, map_revision=current.revision)


@router.post("", summary="Start a rebalance (or add/remove nodes)", status_code=202, response_model=RebalanceStatus,
             responses=problems(401, 403, 404, 409, 422, 503, described=_CONFLICT))
async def start_rebalance(body: RebalanceBody, request: Request, ctx: AdminCtx) -> RebalanceStatus:
    """Move partitions until every live node (less the removed ones) holds its share of actives
    and replicas: a new copy streams as a replica until in sync, then the active is handed over
    by takeover (writes pause for a moment: a retryable 503; no failover-log entry, so no consumer
    rolls back), then the copy no longer wanted is dropped.  Refused, with the reason in
    `request.refused`, when it cannot be planned (a node down); a node going down later pauses
    the moves (`request.waiting`) until it is back."""
    both = sorted(set(body.remove) & set(body.add))
    if both:
        raise Problem(INVALID_INPUT, f"node {both[0]!r} is both removed and added: name it in one list", field="add")
    if len(set(body.remove)) + len(set(body.add)) > 63:
        raise Problem(INVALID_INPUT, "at most 63 nodes may be removed and added in one request", field="remove")
    cluster = _cluster(request)
    known = set(cluster.nodes) | set(cluster.map.nodes())
    for node in body.remove:
        if node not in known:
            raise Problem(NOT_FOUND, f"unknown node {node!r}: it is neither up nor named by the map "
                                     f"(revision {cluster.map.revision})", field="remove")
    for node in body.add:
        if node not in cluster.nodes:
            raise Problem(NODE_NOT_UP, f"node {node!r} is not up: start it with `upr server --cluster ... --node "
                                       f"{node}` first; it joins holding nothing until a rebalance", field="add")
    try:
        observed = await cluster.rebalance.observe()
        eject = (observed.ejected | set(body.remove)) - set(body.add)
        eject = {n for n in eject if n in known}
        asked = RebalanceRequest(eject=tuple(sorted(eject)), id=uuid.uuid4().hex[:12])
        if not await cluster.rebalance.ask(asked, remove=tuple(sorted(set(body.remove))),
                                           add=tuple(sorted(set(body.add)))):
            raise Problem(REBALANCE_RUNNING, "a rebalance is already in progress: follow it with "
                                             "`upr cluster rebalance` or stop it with `--stop`")
    except EtcdError as exc:
        raise Problem(NOT_READY, f"etcd did not answer: {exc.message}") from None
    return await _status(cluster)


@router.get("", summary="Progress of the rebalance", response_model=RebalanceStatus,
            responses=problems(401, 403, 404, 503))
async def rebalance_status(request: Request, ctx: ReadCtx) -> RebalanceStatus:
    """The run in progress (null once ended: see `last`), partitions moved / remaining, items
    transferred, takeovers in flight and new copies being built."""
    return await _status(_cluster(request))


@router.delete("", summary="Stop the rebalance", response_model=RebalanceStatus, responses=problems(401, 403, 404, 503))
async def stop_rebalance(request: Request, ctx: AdminCtx) -> RebalanceStatus:
    """Takeovers not yet switched are called off (their partitions take writes on the old active
    again) and copies being built are dropped; what moved stays moved.  Posting again resumes."""
    cluster = _cluster(request)
    try:
        await cluster.rebalance.stop()
    except EtcdError as exc:
        raise Problem(NOT_READY, f"etcd did not answer: {exc.message}") from None
    return await _status(cluster)
