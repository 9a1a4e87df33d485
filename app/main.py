"""The application factory.

``create_app(settings)`` builds a FastAPI app whose lifespan owns the engine: it opens
the engine (off the event loop) at startup and closes it cleanly at shutdown, after
the stream connections have been asked to end.  Nothing is created at import time, so
tests and ``upr openapi`` build apps freely without touching a data directory.

``app.state`` holds: ``settings``, ``tokens``, ``metrics``, ``streams`` (the stream
registry, read by ``GET /streams``), ``started_at``, and while the engine is open
``runner`` (the engine behind its executors), ``cluster`` (``app.cluster.node.ClusterNode``
with ``--cluster``, else None) and ``stream_server`` (``app.stream.server``:
hub, reader jobs and connection slots of the ``GET /stream`` connections); both None otherwise.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.openapi.utils import get_openapi
from starlette.responses import Response

from app import api_docs, problems, ui
from app.auth import TokenTable
from app.fast_bulk import BulkFastPath
from app.limits import BodyLimit, BodyTooLarge
from app.metrics import Metrics, MetricsMiddleware
from app.stream.rawframes import RawSendScope
from app.models import BulkItem
from app.problems import PROBLEM_MEDIA_TYPE
from app.routes import admin, bulk, cluster, docs, handover, health, partitions, rebalance, stream_status, status
from app.runner import EngineRunner
from app.settings import Settings
from app.streams_registry import StreamRegistry
from engine.config import EngineConfig
from engine.core.types import MAX_SEQNO

log = logging.getLogger("upr.server")

#: ``upr server``'s exit code when the engine closed with writes it could not persist (disk full):
#: a supervisor sees that the stop lost data (EXIT_CONFIG, 2, is a refused configuration).
EXIT_UNFLUSHED = 3

DESCRIPTION = """Change-data-capture streaming service in the line of Couchbase UPR/DCP.

Writers `PUT`/`DELETE` documents or `POST /docs/_bulk`; every change gets a per-partition
seqno that consumers stream from `GET /stream` (WebSocket).  Errors are RFC 9457
`application/problem+json` with a stable `type` URI.  Auth: `Authorization: Bearer <token>`
with roles read < write < admin (none needed in protected mode on loopback)."""


def _open_engine(config: EngineConfig) -> Any:
    from engine.engine import Engine

    return Engine.open(config)


def create_app(
    settings: Settings,
    *,
    tokens: TokenTable | None = None,
    open_engine: Callable[[EngineConfig], Any] = _open_engine,
) -> FastAPI:
    """A new app; the engine opens when the app's lifespan starts."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from app.stream.endpoint import stream_metrics
        from app.stream.server import StreamServer

        engine = await asyncio.to_thread(open_engine, settings.engine_config())
        runner = EngineRunner(engine, settings.read_threads)
        app.state.metrics.attach(engine, app.state.streams)
        app.state.runner = runner
        app.state.stream_server = StreamServer(engine=engine, runner=runner, limits=app.state.stream_limits,
                                               streams=app.state.streams, metrics=app.state.metrics,
                                               stream_metrics=stream_metrics(app))
        app.state.started_at = time.monotonic()
        log.info("engine open: %s (%d partitions, node %s)", settings.data_dir, engine.num_partitions, engine.node_id)
        if settings.cluster is not None:
            from app.cluster.metrics import ClusterCollector
            from app.cluster.node import ClusterNode
            from engine.protocol.messages import Visibility

            node = ClusterNode(engine, settings.node_config())
            # before the node starts: a replica may stream from us as soon as we are in the map
            stream_server = app.state.stream_server
            stream_server.replica_acks = node.durable
            # visibility: majority streams stop at what a majority of the copies hold, and wake
            # when an ack (or a new map) moves it
            stream_server.set_ceiling_provider(Visibility.MAJORITY,
                                               lambda p: node.durable.majority_seqno(p, False))
            node.durable.on_advance = stream_server.ceiling_advanced
            await node.start()
            app.state.cluster = node
            app.state.metrics.attach_cluster(ClusterCollector(node.view, node.replication, node.durable))
            app.state.stream_server.owner_of = node.misdirected
        await ui.start(app, engine, runner)
        try:
            yield
        finally:
            await ui.stop(app)
            cluster, app.state.cluster = app.state.cluster, None
            if cluster is not None:
                await cluster.stop()
            stream_server, app.state.stream_server = app.state.stream_server, None  # new streams: 503
            await stream_server.close()
            app.state.runner = None
            app.state.metrics.detach()
            runner.shutdown()
            await asyncio.to_thread(engine.close)
            app.state.closed_clean = getattr(engine, "closed_clean", True) is not False
            if app.state.closed_clean:
                log.info("engine closed cleanly")
            else:  # the engine has logged what was lost, per partition
                log.error("engine closed with unpersisted writes lost; exiting with code %d", EXIT_UNFLUSHED)

    app = FastAPI(
        title="upr",
        version=status.VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        # /docs is the documents resource: the interactive API docs live under /api (app.api_docs).
        docs_url=None,
        redoc_url=None,
        openapi_tags=[
            {"name": "documents", "description": "write and read documents"},
            {"name": "status", "description": "liveness, readiness, node status, metrics"},
            {"name": "partitions", "description": "per-partition state and seqnos"},
            {"name": "streams", "description": "open stream connections"},
            {"name": "cluster", "description": "nodes, the partition map and replica progress (--cluster)"},
            {"name": "admin", "description": "operator actions (admin role)"},
        ],
    )
    app.state.settings = settings
    app.state.tokens = tokens if tokens is not None else TokenTable.load(settings.tokens_file, settings.tokens)
    app.state.metrics = Metrics()
    app.state.streams = StreamRegistry()
    app.state.stream_limits = settings.stream_limits()
    app.state.runner = None
    app.state.stream_server = None
    app.state.cluster = None
    app.state.started_at = time.monotonic()
    app.state.closed_clean = True

    problems.install(app)
    app.add_exception_handler(BodyTooLarge, _body_too_large)  # type: ignore[arg-type]
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    # stream connections write their frames to the transport directly (rawframes.py)
    app.add_middleware(RawSendScope)
    # outermost: the bulk route answered without the layers inside it (app/fast_bulk.py)
    app.add_middleware(BulkFastPath, owner=app, limit=settings.max_request_bytes)
    modules = (health, bulk, docs, status, partitions, stream_status, cluster, handover, rebalance, admin)
    for module in modules:
        # Added flat rather than with include_router: FastAPI's included-router matching cost
        # ~20% of a small request here.  The routers carry their prefixes and tags already.
        app.router.routes.extend(module.router.routes)
    app.state.http_routes = [r for m in modules for r in m.router.routes if isinstance(r, APIRoute)]
    from app import positions, stream  # the stream server's WebSocket routes

    app.include_router(stream.router)
    app.include_router(positions.router)
    api_docs.install(app)
    ui.install(app)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


async def _body_too_large(request: Request, exc: BodyTooLarge) -> Response:
    return exc.problem.response(request.url.path)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, tidied: problem responses are only ``application/problem+json``,
    and models referenced only from hand-written request bodies are included."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes, tags=app.openapi_tags
    )
    schema.setdefault("components", {})["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "token from --tokens-file or UPR_TOKENS"}
    }
    components = schema["components"].setdefault("schemas", {})
    components.setdefault("BulkItem", BulkItem.model_json_schema(ref_template="#/components/schemas/{model}"))
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            if "401" in operation.get("responses", {}):
                operation["security"] = [{"bearer": []}]
            for code, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if PROBLEM_MEDIA_TYPE in content:
                    content.pop("application/json", None)
                if code == "422" and not content:
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
                elif code == "422" and "application/json" in content:
                    content.pop("application/json")
                    content[PROBLEM_MEDIA_TYPE] = {"schema": {"$ref": "#/components/schemas/Problem"}}
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    _integer_bounds(schema)
    app.openapi_schema = schema
    return schema


_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
#: bounds that a float cannot carry exactly, by the float FastAPI turns them into
_EXACT_BOUNDS = {float(MAX_SEQNO): MAX_SEQNO}


def _integer_bounds(node: Any) -> None:
    """Publish an integer schema's bounds as integers (``65535``, ``18446744073709551615``).

    WHY: FastAPI passes the document through its OpenAPI model, whose bounds are floats, so
    2**64 - 1 came out as ``1.8446744073709552e+19``: a value the server refuses, admitted by
    the document, and rounded by client generators."""
    if isinstance(node, list):
        for item in node:
            _integer_bounds(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "integer":
        for name in _BOUND_KEYS:
            value = node.get(name)
            if isinstance(value, float) and value.is_integer():
                node[name] = _EXACT_BOUNDS.get(value, int(value))
    for value in node.values():
        _integer_bounds(value)
