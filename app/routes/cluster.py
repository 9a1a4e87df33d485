"""``GET /cluster``: this node's view of the cluster (``--cluster``): nodes, the partition map with
each replica's progress, the orchestrator.  Every node answers; a replica's lag is filled in by
the node active for its partition (see ``app.cluster.node.ClusterNode.view``)."""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from app.deps import ReadCtx
from app.problems import NOT_FOUND, Problem
from app.routes.responses import problems

router = APIRouter(tags=["cluster"])


class ClusterNodeInfo(BaseModel):
    name: str
    state: Literal["up", "down"] = Field(description="up: its lease is alive; down: named by the map, lease gone")
    url: str | None = Field(description="where it serves (null while down)")


class ReplicaInfo(BaseModel):
    node: str
    seqno: int | None = Field(description="end of the last whole snapshot it reported (null: no report yet)")
    in_sync: bool = Field(description="it caught up with the active and may be promoted")
    lag: int | None = Field(description="seqnos behind the active: its high seqno minus the replica's acknowledged "
                                        "received seqno, or its last reported seqno before an ack (known on the "
                                        "active's node, else null)")
    received_seqno: int | None = Field(None, description="end of the last whole snapshot the replica acknowledged "
                                       "holding in memory on its current stream (active's node only, else null)")
    persisted_seqno: int | None = Field(None, description="end of the last whole snapshot the replica acknowledged "
                                        "persisted on its current stream (active's node only, else null)")
    persist_lag: int | None = Field(None, description="seqnos the replica has not yet persisted (active's node only)")


class PartitionPlacement(BaseModel):
    partition: int
    active: str | None
    replicas: list[ReplicaInfo]


class ClusterMap(BaseModel):
    revision: int = Field(description="grows with every map change; 0 before the first map")
    partitions: list[PartitionPlacement]


class ClusterView(BaseModel):
    node: str = Field(description="the node answering")
    fenced: bool = Field(description="this node lost its lease and serves nothing until it rejoins")
    orchestrator: str | None
    nodes: list[ClusterNodeInfo]
    map: ClusterMap


@router.get("/cluster", summary="Cluster nodes and partition map", response_model=ClusterView,
            responses=problems(401, 403, 404))
async def cluster_view(request: Request, ctx: ReadCtx) -> ClusterView:
    """Nodes (name, up/down, URL), the map (revision; per partition the active and the replicas
    with seqno, in sync and lag) and the elected orchestrator, as this node last read them."""
    node = getattr(request.app.state, "cluster", None)
    if node is None:
        raise Problem(NOT_FOUND, "this node is not in a cluster (started without --cluster)")
    return ClusterView.model_validate(node.view())
