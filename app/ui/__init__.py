"""The operations console at ``GET /ui/``: one static page, its assets, and one JSON feed.

The page (``app/ui/static``: plain HTML, CSS and JavaScript, no build step, no CDN) asks
``GET /ui/api/overview`` once a second and ``GET /events`` by long polling, both with the
token in the ``Authorization`` header.  The page and its assets carry no data, so they are
served without a token; everything they show comes from routes that need the read role.

``install(app)`` at app creation; ``start(app, engine, runner)`` / ``stop(app)`` from the
lifespan around the engine's life (the monitor also records the node's events, so it runs
whether or not a console is open).
"""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI

from app import events as ev
from app.events_api import EventFeed
from app.ui.monitor import NodeMonitor, node_name, unclean_restart_event


def install(app: FastAPI) -> None:
    from app import events_api
    from app.ui import routes

    app.state.events = ev.EventLog()
    app.state.console_monitor = None
    app.router.routes.extend(events_api.router.routes)
    routes.install(app)


async def start(app: FastAPI, engine: Any, runner: Any) -> None:
    events: ev.EventLog = app.state.events
    ev.bind(engine, events)
    app.state.event_feed = EventFeed(events, asyncio.get_running_loop())
    await runner.read(unclean_restart_event, engine, events, node_name(app, engine))
    monitor = NodeMonitor(app, engine, runner, events)
    await monitor.tick()  # the baseline, so the first page load has numbers
    monitor.start()
    app.state.console_monitor = monitor


async def stop(app: FastAPI) -> None:
    monitor, app.state.console_monitor = app.state.console_monitor, None
    if monitor is not None:
        await monitor.stop()
    feed = getattr(app.state, "event_feed", None)
    if feed is not None:
        feed.detach()
