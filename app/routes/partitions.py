"""``GET /partitions`` and ``GET /partitions/{id}``: per-partition state and seqnos."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from app.deps import ReadCtx
from app.models import FailoverEntry, PartitionStatus, PartitionList
from app.problems import UNKNOWN_PARTITION, Problem
from app.routes.responses import problems
from engine.core.types import PartitionStats

router = APIRouter(prefix="/partitions", tags=["partitions"])

PartitionId = Annotated[int, Path(ge=0, le=1023, description="partition number, 0 <= id < partitions (<= 1024)")]


def partition_info(st: PartitionStats) -> PartitionStatus:
    return PartitionStatus(
        partition=st.partition, state=st.state, uuid=st.uuid, high_seqno=st.high_seqno,
        persisted_seqno=st.persisted_seqno, purge_seqno=st.purge_seqno, item_count=st.item_count,
        queue_depth=st.queue_depth, queue_bytes=st.queue_bytes,
        failover_log=[FailoverEntry(uuid=e.uuid, seqno=e.seqno) for e in st.failover_log],
    )


def check_partition(engine: Any, partition: int) -> None:
    if not 0 <= partition < engine.num_partitions:
        raise Problem(
            UNKNOWN_PARTITION, f"partition {partition} does not exist; this node has {engine.num_partitions}",
            field="path.partition", partition=partition,
        )


@router.get("", summary="All partitions", response_model=PartitionList, responses=problems(401, 403, 503))
async def list_partitions(ctx: ReadCtx) -> PartitionList:
    """State, high/persisted/purge seqnos, item count, queue depth and failover log of every partition."""
    runner = ctx.runner
    stats = await runner.read(runner.engine.all_stats)
    return PartitionList(partitions=[partition_info(s) for s in stats])


@router.get(
    "/{partition}", summary="One partition", response_model=PartitionStatus, responses=problems(401, 403, 404, 422, 503)
)
async def get_partition(partition: PartitionId, ctx: ReadCtx) -> PartitionStatus:
    """State, seqnos, item count, queue depth and failover log (newest first) of one partition."""
    runner = ctx.runner
    check_partition(runner.engine, partition)
    return partition_info(await runner.read(runner.engine.stats, partition))
