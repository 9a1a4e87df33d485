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


@router.get(
    "/ready",
    summary="Readiness",
    response_model=Ready,
    responses={503: {"model": Ready, "description": "engine not open or flusher stopped"}},
)
async def ready(request: Request) -> Response:
    """200 once the engine is open and its flusher thread runs; 503 otherwise."""
    runner = getattr(request.app.state, "runner", None)
    engine_open = runner is not None and not runner.engine.closed
    flusher = engine_open and flusher_running(runner.engine)
    body = Ready(ready=engine_open and flusher, engine_open=engine_open, flusher_running=flusher)
    return Response(body.model_dump_json(), 200 if body.ready else 503, media_type="application/json")
