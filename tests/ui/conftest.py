"""Fixtures of the console's browser tests: one Chromium per module, real servers, a consumer on
its own event loop thread (the browser's sync API and the WebSocket client each keep theirs)."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from bench.suite.install import Skip
from tests.ui.browser import ensure_chromium, ensure_playwright

T = TypeVar("T")


class LoopThread:
    """An asyncio loop on a thread: ``run(coro)`` from sync test code (stream consumers)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    try:
        ensure_playwright()
        return ensure_chromium()
    except Skip as exc:
        pytest.skip(f"no browser for the console tests: {exc}")


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=chromium_path, args=["--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()
