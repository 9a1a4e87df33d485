"""``GET /stream``: authenticate, take a connection slot, and hand the socket to the app's
``StreamServer`` (made by the lifespan while the engine is open).

Auth (``read`` role, the same bearer tokens as HTTP; ``?access_token=`` for clients that
cannot set headers) is checked *before* the upgrade: a refused client gets a plain HTTP
401/403 problem document, never an open WebSocket.
"""
from __future__ import annotations

from typing import Any

import orjson
from prometheus_client import Counter, Histogram
from fastapi import APIRouter, WebSocket
from starlette.responses import Response

from app.auth import AuthError, Role, authorize_connection
from app.problems import (
    ENGINE_CLOSED,
    FORBIDDEN,
    PROBLEM_MEDIA_TYPE,
    TOO_MANY_CLIENT_STREAMS,
    TOO_MANY_STREAMS,
    UNAUTHORIZED,
    Problem,
)
from app.stream.server import StreamServer
from app.stream.slots import SlotRefusal

__all__ = ["router", "stream_metrics"]

router = APIRouter(tags=["streams"])


def _refusal_problem(refusal: SlotRefusal, client: str) -> Problem:
    if refusal.scope == "server":
        return Problem(TOO_MANY_STREAMS,
                       f"this server serves at most {refusal.limit} stream connections (--stream-max-connections)",
                       headers={"Retry-After": "1"}, extra={"limit": refusal.limit})
    return Problem(TOO_MANY_CLIENT_STREAMS,
                   f"{client} already holds {refusal.limit} stream connections, the most one client may hold "
                   "(--stream-max-connections-per-client)",
                   headers={"Retry-After": "1"}, extra={"limit": refusal.limit})


class StreamMetrics:
    """The stream server's own figures, registered in the app's metrics registry."""

    def __init__(self, registry: Any) -> None:
        self.delivery = Histogram(
            "upr_stream_delivery_seconds",
            "engine change notification to the first frame carrying it sent, per partition visit",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        self.cursor_drops = Counter(
            "upr_stream_cursor_drops", "snapshots released because a consumer stalled (cursor dropping)",
            registry=registry,
        )


def stream_metrics(app: Any) -> StreamMetrics:
    found: StreamMetrics | None = getattr(app.state, "stream_metrics", None)
    if found is None:
        found = StreamMetrics(app.state.metrics.registry)
        app.state.stream_metrics = found
    return found


async def _deny(ws: WebSocket, problem: Problem) -> None:
    body = problem.body(ws.url.path)
    await ws.send_denial_response(
        Response(orjson.dumps(body), problem.status, problem.headers, media_type=PROBLEM_MEDIA_TYPE)
    )


@router.websocket("/stream")
async def stream(ws: WebSocket) -> None:
    """Change stream (see ``docs/architecture.md`` "Stream protocol" and ``openapi/asyncapi.yaml``)."""
    app = ws.app
    try:
        principal = authorize_connection(app.state.tokens, ws, Role.READ, allow_query=True)
    except AuthError as exc:
        ptype = UNAUTHORIZED if exc.status == 401 else FORBIDDEN
        headers = {"WWW-Authenticate": 'Bearer realm="upr"'} if exc.status == 401 else None
        await _deny(ws, Problem(ptype, exc.detail, headers=headers, extra={"required_role": "read"}))
        return
    server: StreamServer | None = getattr(app.state, "stream_server", None)
    if server is None:
        await _deny(ws, Problem(ENGINE_CLOSED, "the engine is not open (starting or shutting down)",
                                headers={"Retry-After": "1"}))
        return
    # the token's name when auth is on; in protected mode every caller is the same local admin
    client = f"address {ws.client.host}" if app.state.tokens.protected_mode and ws.client else f"token {principal.name}"
    refusal = server.slots.acquire(client)
    if refusal is not None:
        await _deny(ws, _refusal_problem(refusal, client))
        return
    try:
        await server.serve(ws, may_replicate=principal.role >= Role.ADMIN)
    finally:
        server.slots.release(client)
