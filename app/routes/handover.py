"""``/cluster/failover``: graceful failover of a live node (``upr cluster failover NODE``).

Any node takes the request and stores it in etcd; the orchestrator carries it out
(``engine.cluster.handover``) and the command follows its progress with ``GET``.  ``DELETE``
withdraws it: partitions not yet handed over take writes on their node again."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from app.cluster.etcd import EtcdError
from app.deps import AdminCtx, ReadCtx
from app.problems import NOT_FOUND, NOT_READY, Problem
from app.routes.responses import problems
from engine.cluster.handover import HandoverRequest

router = APIRouter(prefix="/cluster/failover", tags=["cluster"])


class FailoverRequest(BaseModel):
    node: str = Field(min_length=1, max_length=200, description="the node to empty of active partitions")
    force: bool = Field(False, description="hand a partition to a replica still catching up (its writes stay "
                                           "paused until it has caught up) instead of refusing")


class HandoverInfo(BaseModel):
    partition: int
    source: str
    target: str
    fenced_at: int | None = Field(description="the source's high seqno when it stopped taking writes "
                                              "(null: not yet stopped)")


class RequestInfo(BaseModel):
    node: str
    force: bool
    refused: str | None = Field(description="why the orchestrator cannot do it (null: in progress or waiting)")


class FailoverStatus(BaseModel):
    node: str
    request: RequestInfo | None = Field(description="the stored request; null once done or withdrawn")
    active: list[int] = Field(description="partitions the map still makes the node active for")
    handovers: list[HandoverInfo] = Field(description="its partitions on their way to a replica")
    replica_of: dict[int, str | None] = Field(description="partitions the node holds a replica of -> their active")
    map_revision: int


def _cluster(request: Request) -> Any:
    node = getattr(request.app.state, "cluster", None)
    if node is None:
        raise Problem(NOT_FOUND, "this node is not in a cluster (started without --cluster)")
    return node


def _known(cluster: Any, node: str) -> None:
    if node not in cluster.nodes and node not in cluster.map.nodes():
        raise Problem(NOT_FOUND, f"unknown node {node!r}: it is neither up nor named by the map "
                                 f"(revision {cluster.map.revision})", field="node")


async def _status(cluster: Any, node: str) -> FailoverStatus:
    store = cluster.handover.store
    try:
        requests, records = await store.requests(), await store.records()
    except EtcdError as exc:
        raise Problem(NOT_READY, f"etcd did not answer: {exc.message}") from None
    request = requests.get(node)
    return FailoverStatus(
        node=node,
        request=RequestInfo(**request.to_json()) if request is not None else None,
        active=list(cluster.map.active_partitions(node)),
        handovers=[HandoverInfo(**s.handover.to_json()) for _p, s in sorted(records.items())
                   if s.handover.source == node],
        replica_of={p: cluster.map.active_of(p) for p in cluster.map.replica_partitions(node)},
        map_revision=cluster.map.revision,
    )


@router.post("", summary="Start a graceful failover", status_code=202, response_model=FailoverStatus,
             responses=problems(401, 403, 404, 413, 422, 503))
async def start_failover(body: FailoverRequest, request: Request, ctx: AdminCtx) -> FailoverStatus:
    """Hand every partition the node is active for to an in-sync replica without losing a write:
    the node stops taking writes for the partition (clients get a retryable 503), the replica
    receives everything up to its high seqno, then becomes active keeping the history (no
    consumer rolls back) and the node stays on as its replica.  Refused, with the reason in
    `request.refused`, when a partition has no in-sync replica (unless `force`)."""
    cluster = _cluster(request)
    _known(cluster, body.node)
    try:
        await cluster.handover.store.ask(HandoverRequest(body.node, body.force))
    except EtcdError as exc:
        raise Problem(NOT_READY, f"etcd did not answer: {exc.message}") from None
    return await _status(cluster, body.node)


@router.get("/{node}", summary="Progress of a graceful failover", response_model=FailoverStatus,
            responses=problems(401, 403, 404, 503))
async def failover_status(node: str, request: Request, ctx: ReadCtx) -> FailoverStatus:
    """The stored request (null once done), the partitions the map still makes the node active
    for, and its handovers in flight with the seqno each stopped taking writes at."""
    cluster = _cluster(request)
    _known(cluster, node)
    return await _status(cluster, node)


@router.delete("/{node}", summary="Withdraw a graceful failover", response_model=FailoverStatus,
               responses=problems(401, 403, 404, 503))
async def withdraw_failover(node: str, request: Request, ctx: AdminCtx) -> FailoverStatus:
    """Partitions not yet handed over take writes on the node again; those already handed over
    stay with their new active."""
    cluster = _cluster(request)
    _known(cluster, node)
    try:
        await cluster.handover.store.withdraw(node)
    except EtcdError as exc:
        raise Problem(NOT_READY, f"etcd did not answer: {exc.message}") from None
    return await _status(cluster, node)
