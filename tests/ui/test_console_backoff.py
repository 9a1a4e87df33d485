"""The console's event long poll against a node that will not wait (real server, real Chromium).

A node holds at most ``MAX_WAITERS`` waiting ``GET /events`` readers and answers the rest at
once, as if they had not asked to wait.  A page told so must not ask again at once: it would
spin, one request after the other, costing the node a core per open tab.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.events_api import MAX_WAITERS
from tests.support.server import ServerProcess, start_server
from tests.ui.conftest import LoopThread

pytestmark = pytest.mark.slow

DEADLINE_S = 20.0
#: the page polls overview once a second and, told not to wait, events at most as often
WATCH_S = 3.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = start_server(tmp_path_factory.mktemp("console-backoff") / "upr", partitions=4)
    yield s
    s.kill()


async def _hold_every_waiting_slot(url: str) -> tuple[httpx.AsyncClient, list[asyncio.Future[Any]]]:
    """Long polls filling every waiting slot of the node (nothing is recorded meanwhile): a few
    more than ``MAX_WAITERS``, until one is answered at once, which the node does only when full."""
    client = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=MAX_WAITERS + 16))
    first = (await client.get(f"{url}/events")).json()
    query = f"{url}/events?since={first['last_id']}&log={first['log_id']}"
    held = [asyncio.ensure_future(client.get(query, headers={"Prefer": "wait=25"})) for _ in range(MAX_WAITERS + 2)]
    done, _ = await asyncio.wait(held, timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
    assert done, f"the node let {MAX_WAITERS + 2} readers wait"
    refused = next(iter(done)).result().json()
    assert refused["events"] == [] and refused["last_id"] == first["last_id"], refused
    return client, held


async def _release(client: httpx.AsyncClient, held: list[asyncio.Future[Any]]) -> None:
    for f in held:
        f.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    await client.aclose()


def test_a_page_told_not_to_wait_does_not_poll_events_in_a_loop(browser: Any, server: ServerProcess,
                                                                loop_thread: LoopThread) -> None:
    client, held = loop_thread.run(_hold_every_waiting_slot(server.url))
    context = browser.new_context()
    try:
        tab = context.new_page()
        polls: list[str] = []
        tab.on("request", lambda r: polls.append(r.url) if "/events?" in r.url else None)
        tab.goto(server.url + "/ui/")
        tab.wait_for_selector("#map .cell", timeout=DEADLINE_S * 1000)
        polls.clear()
        tab.wait_for_timeout(WATCH_S * 1000)  # the browser's events reach `polls` while it waits
        # one poll a second at most, and a little slack for a poll answered as the watch began
        assert len(polls) <= WATCH_S + 2, f"{len(polls)} event polls in {WATCH_S:.0f}s"
    finally:
        context.close()
        loop_thread.run(_release(client, held))
