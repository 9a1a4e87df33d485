"""``POST /positions/check``: what would a stream request get right now, without opening a stream?

A consumer (or a Spark job, or an operator) posts the positions it holds per partition, the same
(uuid, seqno, snapshot range) it would put in ``stream_request``, and gets, per partition, the
answer the stream would give (``ok``, ``rollback`` to R, ``not_my_partition``, ``range_error``)
with the rule that decided it (``from_zero``, ``same_history``, ``unknown_uuid``, ``purged``,
``diverged``, ``partial_snapshot``, ...) and the numbers it used.  The decision is the very
function the stream uses (``app.stream.control.evaluate`` over ``engine.rollback.decide``), so a
checkpoint validated here behaves the same when the job starts.  A dry run: nothing is counted as
a rollback in ``/metrics``.
"""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from app.deps import ReadUser, RunnerDep
from app.problems import UNKNOWN_PARTITION, Problem
from app.routes.responses import problems
from app.stream.control import Verdict, evaluate
from engine.protocol import messages as M
from engine.types import MAX_SEQNO

__all__ = ["router"]

router = APIRouter(tags=["streams"])


class HeldPosition(BaseModel):
    """One partition's saved position (``StreamOffset`` plus the partition)."""

    model_config = ConfigDict(extra="forbid")

    partition: int = Field(ge=0, le=0xFFFF)
    uuid: int = Field(ge=0, le=MAX_SEQNO, description="failover-log uuid the consumer last saw (0: none)")
    seqno: int = Field(ge=0, le=MAX_SEQNO, description="last seqno the consumer has")
    snap_start: int = Field(ge=0, le=MAX_SEQNO)
    snap_end: int = Field(ge=0, le=MAX_SEQNO)
    end_seqno: int | None = Field(None, ge=0, le=MAX_SEQNO)
    expected_state: Literal["active", "replica"] = "active"
    strict_uuid: bool = False


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


def _check_all(engine: object, positions: list[HeldPosition]) -> list[Verdict]:
    out = []
    for pos in positions:
        req = M.StreamRequest(
            partition=pos.partition, uuid=pos.uuid, start_seqno=pos.seqno, snap_start=pos.snap_start,
            snap_end=pos.snap_end, expected_state=pos.expected_state, end_seqno=pos.end_seqno,
            strict_uuid=pos.strict_uuid,
        )
        out.append(evaluate(engine, pos.partition, req))
    return out


@router.post(
    "/positions/check",
    summary="Check saved stream positions",
    response_model=PositionsVerdict,
    responses=problems(401, 403, 404, 422, 503),
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
    verdicts = await runner.read(_check_all, engine, body.positions)
    results = []
    for pos, v in zip(body.positions, verdicts, strict=True):
        r = v.response
        resume = r.rollback_seqno if r.rollback_seqno is not None else pos.seqno
        results.append(PositionVerdict(
            partition=pos.partition, status=r.status.value, rule=v.rule, rollback_seqno=r.rollback_seqno,
            reason=r.reason, detail=r.detail, field=r.field, state=v.state, high_seqno=v.high_seqno,
            purge_seqno=v.purge_seqno, behind=max(0, v.high_seqno - resume), current_uuid=v.uuid,
            failover_log=[[e.uuid, e.seqno] for e in (r.failover_log or ())],
        ))
    return PositionsVerdict(results=results)
