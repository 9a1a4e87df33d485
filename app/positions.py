"""``POST /positions/check``: what would a stream request get right now, without opening a stream?

A consumer (or a Spark job, or an operator) posts the positions it holds per partition, the same
(uuid, seqno, snapshot range) it would put in ``stream_request``, and gets, per partition, the
answer the stream would give (``ok``, ``rollback`` to R, ``not_my_partition``, ``range_error``)
with the rule that decided it (``from_zero``, ``same_history``, ``unknown_uuid``, ``purged``,
``diverged``, ``partial_snapshot``, ...) and the numbers it used.  The decision is the very
rules the stream uses (``engine.core.rollback.decide``, fed exactly as ``ServerSession.stream_info``
feeds it: state check first, ``to_now``-free end seqno), so a checkpoint validated here behaves the
same when the job starts.  A dry run: nothing is counted as
a rollback in ``/metrics``.
"""
from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from app.deps import ReadUser, RunnerDep
from app.models import U16, U64, StrictBool
from app.problems import UNKNOWN_PARTITION, Problem
from app.routes.responses import problems
from engine.core.errors import SeqnoRangeError
from engine.core.rollback import MustRollBack, StreamPosition, decide
from engine.core.types import MAX_SEQNO

__all__ = ["router"]

router = APIRouter(tags=["streams"])


class HeldPosition(BaseModel):
    """One partition's saved position (``StreamOffset`` plus the partition)."""

    model_config = ConfigDict(extra="forbid")

    partition: U16
    uuid: U64 = Field(description="failover-log uuid the consumer last saw (0: none)")
    seqno: U64 = Field(description="last seqno the consumer has")
    snap_start: U64
    snap_end: U64
    end_seqno: U64 | None = None
    expected_state: Literal["active", "replica"] = "active"
    strict_uuid: StrictBool = False


class PositionsCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    positions: list[HeldPosition] = Field(max_length=65536)


class PositionVerdict(BaseModel):
    partition: int
    status: Literal["ok", "rollback", "not_my_partition", "range_error"]
    #: what decided it: an ok rule, a rollback reason, ``not_my_partition`` or ``range_error``
    rule: str
    rollback_seqno: int | None = None
    #: the rollback reason exactly as ``stream_response.reason`` would carry it
    reason: str | None = None
    detail: str
    field: str | None = None
    state: str
    high_seqno: int
    purge_seqno: int
    #: items the stream would have to send at most (high seqno minus the resume point)
    behind: int
    current_uuid: int
    failover_log: list[list[int]]


class PositionsVerdict(BaseModel):
    results: list[PositionVerdict]


def evaluate(engine: Any, pos: HeldPosition) -> PositionVerdict:
    """Executor side: the answer a stream request from ``pos`` would get now, and its rule."""
    stats = engine.stats(pos.partition)
    state = stats.state.value
    log = tuple(stats.failover_log)
    common: dict[str, Any] = {
        "partition": pos.partition, "state": state, "high_seqno": stats.high_seqno, "purge_seqno": stats.purge_seqno,
        "current_uuid": log[0].uuid if log else 0, "failover_log": [[e.uuid, e.seqno] for e in log],
    }
    if state != pos.expected_state:
        return PositionVerdict(
            status="not_my_partition", rule="not_my_partition", behind=0,
            detail=f"partition {pos.partition} is {state}, not {pos.expected_state}: reload the partition map",
            **common,
        )
    position = StreamPosition(pos.uuid, pos.seqno, pos.snap_start, pos.snap_end, pos.end_seqno, pos.strict_uuid)
    try:
        verdict = decide(log, stats.high_seqno, stats.purge_seqno, position)
    except SeqnoRangeError as exc:
        return PositionVerdict(status="range_error", rule="range_error", detail=exc.message, field=exc.field,
                               behind=0, **common)
    if isinstance(verdict, MustRollBack):
        return PositionVerdict(
            status="rollback", rule=verdict.reason.value, reason=verdict.reason.value, rollback_seqno=verdict.seqno,
            detail=verdict.detail, behind=max(0, stats.high_seqno - verdict.seqno), **common,
        )
    return PositionVerdict(status="ok", rule=verdict.rule.value, detail=verdict.detail,
                           behind=max(0, stats.high_seqno - pos.seqno), **common)


def _check_all(engine: Any, positions: list[HeldPosition]) -> list[PositionVerdict]:
    return [evaluate(engine, pos) for pos in positions]


@router.post(
    "/positions/check",
    summary="Check saved stream positions",
    response_model=PositionsVerdict,
    responses=problems(401, 403, 404, 413, 422, 503),
)
async def check_positions(body: PositionsCheck, runner: RunnerDep, _user: ReadUser) -> PositionsVerdict:
    """For each position (partition, uuid, seqno, snapshot range), the answer a ``stream_request``
    would get right now and the rule that decided it; validates a checkpoint before a job starts."""
    engine = runner.engine
    for i, pos in enumerate(body.positions):
        if pos.partition >= engine.num_partitions:
            raise Problem(
                UNKNOWN_PARTITION,
                f"partition {pos.partition} does not exist; this node has {engine.num_partitions}",
                field=f"positions[{i}].partition", partition=pos.partition,
            )
    return PositionsVerdict(results=await runner.read(_check_all, engine, body.positions))
