"""Running the app under uvicorn, with the protected-mode rule applied first.

WHY programmatic uvicorn (not ``uvicorn app.main:app``): the settings and token table
are checked before anything binds, so a bad config or an unsafe bind fails with one
clear line and a non-zero exit instead of a traceback from inside a worker.
"""
from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import uvicorn

from app.auth import TokenTable, check_bind, is_loopback
from app.main import EXIT_UNFLUSHED, create_app
from app.settings import Settings

log = logging.getLogger("upr.server")

EXIT_CONFIG = 2


class _Server(uvicorn.Server):
    """Writes ``settings.ready_file`` with the bound URL once the socket listens (port 0 works)."""

    def __init__(self, config: uvicorn.Config, ready_file: Path | None) -> None:
        super().__init__(config)
        self._ready_file = ready_file

    async def shutdown(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        """End stream connections first (``stream_end(shutting_down)``, close 1001): uvicorn's own
        shutdown would close every WebSocket with 1012 before the lifespan runs."""
        streams = getattr(getattr(self.config.app, "state", None), "streams", None)
        handles = [h for h in (streams or ()) if hasattr(h, "shutdown")]
        if handles:
            results = await asyncio.gather(*(h.shutdown() for h in handles), return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    log.warning("stream shutdown failed: %s", result)
        await super().shutdown(sockets)
        state = getattr(self.config.app, "state", None)
        if state is not None and not getattr(state, "closed_clean", True):
            # uvicorn re-raises the SIGTERM/SIGINT it caught once shutdown is over; dying by that
            # signal would look like an ordinary stop, so ``serve`` returns EXIT_UNFLUSHED instead
            getattr(self, "_captured_signals", []).clear()

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().startup(sockets)
        if self.started and self._ready_file is not None:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            host = f"[{host}]" if ":" in host else host
            tmp = self._ready_file.with_suffix(".tmp")
            tmp.write_text(f"http://{host}:{port}\n")
            tmp.replace(self._ready_file)


def serve(settings: Settings) -> int:
    """Run until interrupted; returns the process exit code."""
    tokens = TokenTable.load(settings.tokens_file, settings.tokens)
    refusal = check_bind(settings.host, tokens)
    if refusal:
        print(refusal, file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=settings.log_level.upper() if settings.log_level != "trace" else "DEBUG",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if tokens.protected_mode:
        log.warning(
            "protected mode: no auth tokens configured, serving loopback (%s) only; every local caller is admin",
            settings.host,
        )
    else:
        log.info("auth: %d bearer token(s) configured", len(tokens))
        if not is_loopback(settings.host):
            log.info("binding %s: tokens required for every request but /health and /ready", settings.host)
    app = create_app(settings, tokens=tokens)
    config = uvicorn.Config(
        app,
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
    server = _Server(config, settings.ready_file)
    # server.run(), not asyncio.run(server.serve()): only run() builds the loop from config.loop, so
    # the plain asyncio loop ran here instead of uvloop (measured: see docs/benchmarks.md, HTTP)
    server.run()
    if not server.started:
        return 1
    return 0 if app.state.closed_clean else EXIT_UNFLUSHED
