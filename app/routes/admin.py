"""``/admin``: partition state changes, flush, compaction.  Admin role only.

These run on reader threads, not the writer: a flush or a compaction may take a while
and must not hold up document writes queued behind it.
"""
from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from app.deps import AdminCtx
from app.models import CompactRequest, CompactResult, FlushResult, PartitionStatus, StateChange
from app.problems import INVALID_INPUT, UNKNOWN_PARTITION, Problem
from app.routes.partitions import PartitionId, check_partition, partition_info
from app.routes.responses import DISK_FULL_NOTHING_CHANGED, problems

router = APIRouter(prefix="/admin", tags=["admin"])


def _set_state(engine: Any, partition: int, change: StateChange) -> Any:
    engine.set_state(partition, change.state)
    return engine.stats(partition)


@router.post(
    "/partitions/{partition}/state",
    summary="Change a partition's state",
    response_model=PartitionStatus,
    responses=problems(401, 403, 404, 413, 422, 503, 507, described={507: DISK_FULL_NOTHING_CHANGED}),
)
async def set_partition_state(
    partition: PartitionId, change: StateChange, ctx: AdminCtx
) -> PartitionStatus:
    """active/replica/pending/dead.  Only active partitions accept writes; promoting a
    replica or pending partition to active starts a new failover branch.  Streams on a
    partition that leaves active end with `state_changed`.  On a full disk the answer is 507
    `disk-full` and nothing changed."""
    runner = ctx.runner
    check_partition(runner.engine, partition)
    return partition_info(await runner.read(_set_state, runner.engine, partition, change))


def _flush(engine: Any) -> FlushResult:
    start = time.perf_counter()
    engine.flush_now()
    persisted = {s.partition: s.persisted_seqno for s in engine.all_stats()}
    return FlushResult(flushed=True, duration_s=round(time.perf_counter() - start, 6), persisted_seqnos=persisted)


@router.post("/flush", summary="Flush now and wait", response_model=FlushResult,
             responses=problems(401, 403, 503, 507))
async def flush(ctx: AdminCtx) -> FlushResult:
    """Persists everything queued at the time of the call, then answers with the persisted seqnos
    (507 while the disk is full)."""
    return await ctx.runner.read(_flush, ctx.runner.engine)


@router.post(
    "/compact", summary="Purge old tombstones", response_model=CompactResult,
    responses=problems(401, 403, 404, 413, 422, 503, 507, described={507: DISK_FULL_NOTHING_CHANGED}),
)
async def compact(request: CompactRequest, ctx: AdminCtx) -> CompactResult:
    """Removes tombstones below a seqno per partition and/or older than an age, moving each
    partition's purge seqno: consumers resuming from below it must roll back to 0.  On a full
    disk the answer is 507 `disk-full` and nothing was purged."""
    if request.purge_before_seqno is None and request.older_than_s is None:
        raise Problem(INVALID_INPUT, "give purge_before_seqno and/or older_than_s", field="body")
    runner = ctx.runner
    purge = {int(p): seqno for p, seqno in request.purge_before_seqno.items()} if request.purge_before_seqno else None
    for p in purge or {}:
        if not 0 <= p < runner.engine.num_partitions:
            raise Problem(UNKNOWN_PARTITION, f"partition {p} does not exist; this node has "
                          f"{runner.engine.num_partitions}", field="purge_before_seqno", partition=p)
    result = await runner.read(runner.engine.compact, purge_before_seqno=purge, older_than_s=request.older_than_s)
    return CompactResult(purge_seqnos=dict(result))
