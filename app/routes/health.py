"""Liveness and readiness: unauthenticated, cheap, for orchestrators and load balancers."""
from __future__ import annotations

import threading

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.models import Health, Ready

router = APIRouter(tags=["status"])

_OK = b'{"status":"ok"}'


def flusher_running(engine: object) -> bool:
    """Whether the engine's flusher thread is alive.  Uses ``engine.flusher_running`` when
    the engine offers it; otherwise looks for the thread by its name (one engine per process)."""
    own = getattr(engine, "flusher_running", None)
    if own is not None:
        return bool(own() if callable(own) else own)
    return any(t.name == "upr-flusher" and t.is_alive() for t in threading.enumerate())


@router.get("/health", summary="Liveness", response_model=Health)
async def health() -> Response:
    """200 while the process serves HTTP at all (no engine call)."""
    return Response(_OK, media_type="application/json")


def flush_fault(engine: object) -> str | None:
    """What is wrong with flushing to disk (``engine.flush_fault``), or None while it works."""
    fault = getattr(engine, "flush_fault", None)
    return fault.describe() if fault is not None else None


@router.get(
    "/ready",
    summary="Readiness",
    response_model=Ready,
    responses={503: {"model": Ready, "description": "engine not open, flusher stopped, or flushing to disk fails"}},
)
async def ready(request: Request) -> Response:
    """200 once the engine is open, its flusher thread runs and flushing to disk works; 503 with a
    `reason` otherwise.  WHY a failing flush makes the node unready: it still applies writes, but
    cannot persist them (a full disk), so a load balancer should send writers elsewhere."""
    runner = getattr(request.app.state, "runner", None)
    engine_open = runner is not None and not runner.engine.closed
    flusher = engine_open and flusher_running(runner.engine)
    failing = flush_fault(runner.engine) if flusher else None
    if not engine_open:
        reason: str | None = "engine not open"
    elif not flusher:
        reason = "flusher thread stopped"
    elif failing is not None:
        reason = f"flushing to disk fails: {failing}"
    else:
        reason = None
    body = Ready(ready=reason is None, engine_open=engine_open, flusher_running=flusher,
                 flush_failing=failing is not None, reason=reason)
    # a ready node answers as it always has; ``flush_failing`` and ``reason`` appear when they say something
    return Response(body.model_dump_json(exclude_defaults=True), 200 if body.ready else 503,
                    media_type="application/json")
