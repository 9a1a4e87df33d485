"""``POST /docs/_bulk`` answered from the outermost ASGI layer, past the framework's stack.

WHY: a writer that sends small bulks often (a paced ingest, a replicating cluster's clients)
pays per request for every middleware layer, the routing and FastAPI's dependency solving
around the route, which together cost more CPU than the route's own work (py-spy profile in
docs/benchmarks.md, Cluster, "the HTTP stack around the bulk route").  ``BulkFastPath`` runs
the same route function (``app.routes.bulk.answer``) with the same authorisation, body limit
(``app.limits.limited``), request metrics and problem handlers (the app's own
``exception_handlers``), so the answer is the one the full stack gives.  Any other request,
an app with dependency overrides (tests), or one served under a root path goes through the
full stack.  ``app.server`` also puts one in front of the whole FastAPI app (what uvicorn calls),
so a bulk request skips FastAPI's own outer layers as well; the one inside the app's middleware
serves in-process apps (tests, ``bench.bulk_request_cpu``).
"""
from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth import Role, authorize_connection
from app.deps import Ctx
from app.limits import limited
from app.metrics import RequestCounts
from app.routes import bulk


class BulkFastPath:
    """ASGI middleware: the bulk route without the layers between the server and the route."""

    def __init__(self, app: ASGIApp, owner: Any, limit: int) -> None:
        self.app = app
        self.owner = owner  # the FastAPI app: its state, handlers and overrides
        self.limit = limit
        self.counts: RequestCounts | None = None
        self.answered = 0  # requests this layer answered itself (tests, benchmarks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        owner = self.owner
        if (scope["type"] != "http" or scope["path"] != bulk.PATH or scope["method"] != "POST"
                or scope.get("root_path") or owner.dependency_overrides):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        self.answered += 1
        scope["app"] = owner
        request = Request(scope, limited(scope, receive, self.limit))
        try:
            try:
                state = owner.state
                ctx = Ctx(authorize_connection(state.tokens, request, Role.WRITE), state)
                response = await bulk.answer(request, ctx)
            except Exception as exc:
                handler = self._handler_of(exc)
                if handler is None:
                    raise
                response = await handler(request, exc)
            status = response.status_code
            await response(scope, receive, send)
        finally:
            counts = self.counts
            if counts is None:
                counts = self.counts = RequestCounts(owner.state.metrics)
            counts.done("POST", bulk.PATH, status, time.perf_counter() - start)

    def _handler_of(self, exc: Exception) -> Any:
        """The app's handler for ``exc``, looked up by class as Starlette's exception layers do."""
        handlers = self.owner.exception_handlers
        for cls in type(exc).__mro__:
            handler = handlers.get(cls)
            if handler is not None:
                return handler
        return None


__all__ = ["BulkFastPath"]
