"""Liveness and readiness: unauthenticated, cheap, for orchestrators and load balancers."""
from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.models import Health, Ready

router = APIRouter(tags=["status"])

_OK = b'{"status":"ok"}'


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
    engine_open = runner is not None and not getattr(runner.engine, "closed", False)
    flusher = bool(engine_open and runner.engine.flusher_alive()) if engine_open else False
    body = Ready(ready=engine_open and flusher, engine_open=engine_open, flusher_running=flusher)
    return Response(body.model_dump_json(), 200 if body.ready else 503, media_type="application/json")
