"""Running the app under uvicorn, with the protected-mode rule applied first.

WHY programmatic uvicorn (not ``uvicorn app.main:app``): the settings and token table
are checked, and the engine opened, before anything binds, so a bad config, an unsafe bind, a
data dir another server holds or a partition count the data dir does not have fails with one
clear line and a non-zero exit instead of a traceback from inside a worker.
"""
from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import uvicorn

from app.auth import TokenTable, check_bind, is_loopback
from app.fast_bulk import BulkFastPath
from app.main import EXIT_UNFLUSHED, create_app
from app.settings import Settings
from app.shutdown_watch import ShutdownWatch
from engine import gc_tuning
from engine.core.errors import UprError

log = logging.getLogger("upr.server")

EXIT_CONFIG = 2


class _Server(uvicorn.Server):
    """Writes ``settings.ready_file`` with the bound URL once the socket listens (port 0 works)."""

    def __init__(self, config: uvicorn.Config, ready_file: Path | None, app: Any = None) -> None:
        super().__init__(config)
        self._ready_file = ready_file
        #: the FastAPI app (its ``state``): ``config.app`` may be a layer in front of it
        self._app = app if app is not None else config.app

    async def shutdown(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        """End stream connections first (``stream_end(shutting_down)``, close 1001): uvicorn's own
        shutdown would close every WebSocket with 1012 before the lifespan runs."""
        watch = ShutdownWatch()
        watch.arm()
        try:
            await self._shutdown(sockets)
        finally:
            watch.disarm()

    async def _shutdown(self, sockets: list | None) -> None:  # type: ignore[type-arg]
        app_state = getattr(self._app, "state", None)
        feed = getattr(app_state, "event_feed", None)
        if feed is not None:
            feed.close()  # a console's long poll would otherwise hold the exit for its whole wait
        streams = getattr(app_state, "streams", None)
        handles = [h for h in (streams or ()) if hasattr(h, "shutdown")]
        if handles:
            results = await asyncio.gather(*(h.shutdown() for h in handles), return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    log.warning("stream shutdown failed: %s", result)
        await super().shutdown(sockets)
        state = getattr(self._app, "state", None)
        if state is not None and not getattr(state, "closed_clean", True):
            # uvicorn re-raises the SIGTERM/SIGINT it caught once shutdown is over; dying by that
            # signal would look like an ordinary stop, so ``serve`` returns EXIT_UNFLUSHED instead
            getattr(self, "_captured_signals", []).clear()

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().startup(sockets)
        if self.started:
            # what is alive now (modules, the app, the opened engine) lives as long as the
            # process: out of every later collection, a full one examines only what came after
            gc_tuning.freeze_start_up()
        if self.started and self._ready_file is not None:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            host = f"[{host}]" if ":" in host else host
            tmp = self._ready_file.with_suffix(".tmp")
            tmp.write_text(f"http://{host}:{port}\n")
            tmp.replace(self._ready_file)


class StartRefused(Exception):
    """The server cannot start on this data dir; the message is the one line to print."""


def open_engine(settings: Settings) -> Any:
    """The engine on ``settings.data_dir``, or ``StartRefused`` saying why not.

    An explicit ``--partitions`` (flag, ``UPR_PARTITIONS`` or config file) that differs from the
    count an existing data dir was created with is refused, as Kafka refuses to shrink a topic
    and Couchbase fixes its vBucket count: the key → partition hash depends on it, and
    silently keeping the stored count would leave the operator believing otherwise."""
    from engine.engine import Engine

    try:
        engine = Engine.open(settings.engine_config())
    except UprError as exc:
        where = "" if str(settings.data_dir) in exc.message else f"cannot open data dir {settings.data_dir}: "
        raise StartRefused(f"upr: {where}{exc.message}") from None
    except OSError as exc:
        raise StartRefused(f"upr: cannot open data dir {settings.data_dir}: {exc.strerror or exc}") from None
    if "partitions" in settings.model_fields_set and engine.num_partitions != settings.partitions:
        engine.close()
        raise StartRefused(
            f"upr: data dir {settings.data_dir} has {engine.num_partitions} partitions; --partitions "
            f"{settings.partitions} cannot change that (the count is fixed when a data dir is created: "
            f"drop the flag, or restore a backup into a new data dir)"
        )
    return engine


def preflight_cluster(settings: Settings) -> str | None:
    """Why this node cannot join ``--cluster`` (one line), or None: bad flags, etcd unreachable,
    the cluster's fixed partition or replica count differs, the node name is taken."""
    from app.cluster.errors import ClusterError
    from app.cluster.etcd import EtcdError
    from app.cluster.node import preflight

    try:
        config = settings.node_config()
    except ValueError as exc:
        return f"upr: {exc}"
    try:
        asyncio.run(preflight(config))
    except EtcdError as exc:
        return f"upr: cannot join the cluster at {settings.cluster}: {exc}"
    except ClusterError as exc:
        return f"upr: cannot join the cluster at {settings.cluster}: {exc}"
    return None


def serve(settings: Settings) -> int:
    """Run until interrupted; returns the process exit code."""
    tokens = TokenTable.load(settings.tokens_file, settings.tokens)
    refusal = check_bind(settings.host, tokens)
    if refusal:
        print(refusal, file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=settings.log_level.upper() if settings.log_level != "trace" else "DEBUG",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.cluster is not None:
        refusal = preflight_cluster(settings)
        if refusal:
            print(refusal, file=sys.stderr)
            return EXIT_CONFIG
    try:
        engine = open_engine(settings)
    except StartRefused as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    try:
        return _run(settings, tokens, engine)
    finally:
        engine.close()  # a no-op after the lifespan's clean close; closes it if uvicorn never started


def _run(settings: Settings, tokens: TokenTable, engine: Any) -> int:
    if tokens.protected_mode:
        log.warning(
            "protected mode: no auth tokens configured, serving loopback (%s) only; every local caller is admin",
            settings.host,
        )
    else:
        log.info("auth: %d bearer token(s) configured", len(tokens))
        if not is_loopback(settings.host):
            log.info("binding %s: tokens required for every request but /health and /ready", settings.host)
    app = create_app(settings, tokens=tokens, open_engine=lambda _config: engine)
    config = uvicorn.Config(
        # bulk writes answered before FastAPI's own outer layers (error page, telemetry, body limit
        # checks) too; everything else, the lifespan included, goes on to the app
        BulkFastPath(app, owner=app, limit=settings.max_request_bytes),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        timeout_graceful_shutdown=10,
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=settings.ws_ping_timeout_s,
        # The transport's hard ceiling, well above the protocol's limit: a message between the two
        # still reaches the session, which answers with a named `message_too_large` error before
        # closing 1009; only a message past the ceiling is cut by the transport without one.
        ws_max_size=16 * settings.stream_max_message_bytes,
        ws_per_message_deflate=False,
        server_header=False,
    )
    server = _Server(config, settings.ready_file, app)
    # WHY a setting, at Python's 5 ms by default: a thread that wants the GIL waits for the holder's
    # next release or this interval.  A shorter one switches more often, which costs a fan-out
    # more server CPU per delivery than it saves the tail (docs/benchmarks.md, Peers, "Calm
    # machine, main after the seventh session's merges").
    sys.setswitchinterval(settings.gil_switch_interval_ms / 1000.0)
    # server.run(), not asyncio.run(server.serve()): only run() builds the loop from config.loop, so
    # the plain asyncio loop ran here instead of uvloop (measured: see docs/benchmarks.md, HTTP)
    server.run()
    if not server.started:
        return 1
    return 0 if app.state.closed_clean else EXIT_UNFLUSHED
