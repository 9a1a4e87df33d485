"""The app in-process: ``create_app`` behind ``httpx.ASGITransport``, lifespan included.

For route logic (validation, problem bodies, headers, status codes) a subprocess and a socket add
start-up time and nothing to check.  This runs the real app with a real LMDB engine in the test's
event loop; what needs the real server (uvicorn limits, signals, crashes, WebSockets) keeps using
``tests.support.server``.
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from app.auth import TokenTable
from app.main import create_app
from app.settings import Settings

#: The address ASGITransport reports as the client: loopback, so tokenless (protected) mode serves it.
CLIENT = ("127.0.0.1", 50_000)
BASE_URL = "http://upr.test"


@dataclass
class InProcessApp:
    app: FastAPI
    client: httpx.AsyncClient
    settings: Settings


@contextlib.asynccontextmanager
async def in_process_app(data_dir: Path, *, partitions: int = 8, tokens: TokenTable | None = None,
                         **settings: Any) -> AsyncIterator[InProcessApp]:
    """An app on ``data_dir`` with its engine open for the duration of the block.

    ``settings`` are ``Settings`` fields (e.g. ``max_bulk_items=3``); the caller's ``UPR_*``
    environment is not read, so a test sees exactly what it asks for."""
    # model_validate checks the values without reading UPR_* or a config file, unlike Settings(...)
    config = Settings.model_validate({"data_dir": data_dir, "partitions": partitions, **settings})
    app = create_app(config, tokens=tokens if tokens is not None else TokenTable())
    transport = httpx.ASGITransport(app=app, client=CLIENT)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=30) as client:
            yield InProcessApp(app, client, config)
