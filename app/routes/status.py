"""``GET /status`` (node summary) and ``GET /metrics`` (Prometheus text)."""
from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from app.deps import ReadCtx
from app.models import Status, Totals
from app.routes.responses import problems

router = APIRouter(tags=["status"])

VERSION = "0.1.0"


class RateSampler:
    """Turns a monotonically growing counter into a recent rate (per second), sampled at
    most once per ``window`` seconds so frequent callers see a stable figure."""

    def __init__(self, window: float = 1.0) -> None:
        self.window = window
        self._t: float | None = None
        self._count = 0.0
        self.rate = 0.0

    def update(self, count: float, now: float) -> float:
        if self._t is None:
            self._t, self._count = now, count
        elif now - self._t >= self.window:
            self.rate = max(0.0, count - self._count) / (now - self._t)
            self._t, self._count = now, count
        return self.rate


def _totals(engine: Any) -> tuple[list[Any], dict[str, float]]:
    return engine.all_stats(), engine.engine_stats()


@router.get("/status", summary="Node status and totals", response_model=Status, responses=problems(401, 403, 503))
async def status(request: Request, ctx: ReadCtx) -> Status:
    """Node id, uptime, partition count and totals over all partitions."""
    runner, streams, tokens = ctx.runner, ctx.streams, ctx.tokens
    stats, counters = await runner.read(_totals, runner.engine)
    engine = runner.engine
    sampler = getattr(request.app.state, "flush_rate", None)
    if sampler is None:
        sampler = request.app.state.flush_rate = RateSampler()
    flush_rate = sampler.update(float(counters.get("flush_count", 0.0)), time.monotonic())
    return Status(
        node_id=engine.node_id,
        version=VERSION,
        uptime_s=round(time.monotonic() - request.app.state.started_at, 3),
        partitions=engine.num_partitions,
        protected_mode=tokens.protected_mode,
        totals=Totals(
            items=sum(s.item_count for s in stats),
            high_seqno=sum(s.high_seqno for s in stats),
            persisted_seqno=sum(s.persisted_seqno for s in stats),
            queue_depth=sum(s.queue_depth for s in stats),
            queue_bytes=sum(s.queue_bytes for s in stats),
            flush_rate=round(flush_rate, 3),
            streams_connected=len(streams),
        ),
        engine={k: float(v) for k, v in counters.items() if isinstance(v, (int, float))},
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **problems(401, 403, 503)},
)
async def metrics(ctx: ReadCtx) -> Response:
    """Request counts and latencies, per-partition seqnos and queue depth, flush figures,
    stream lag and rollbacks, in the Prometheus text format."""
    text = await ctx.runner.read(generate_latest, ctx.metrics.registry)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
