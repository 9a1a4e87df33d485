"""The console on a node with tokens, in a real headless Chromium: it asks for a token, shows
nothing without one, refuses a wrong one visibly, and keeps the right one out of URLs and out of
storage that outlives the tab."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.server import ServerProcess, start_server

pytestmark = pytest.mark.slow

READ_TOKEN = "console-reader-token-1"
TOKENS = {READ_TOKEN: "read", "console-admin-token-2": "admin"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("console-auth") / "upr", partitions=8, tokens=TOKENS)
    yield srv
    srv.kill()


def test_the_console_asks_for_a_token_and_refuses_a_wrong_one(browser: Any, node: ServerProcess) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    requests: list[Any] = []
    page.on("request", lambda request: requests.append(request))
    try:
        page.goto(node.url + "/ui/")
        page.wait_for_selector("#login:not([hidden])")
        assert page.locator("#main").is_hidden()
        assert page.locator("#partitions-table > tbody > tr").count() == 0  # nothing shown, nothing loaded
        assert "sign-in required" in page.locator("#conn").inner_text()

        page.fill("#token", "not-a-token")
        page.click("#login-form button")
        error = page.locator("#login-error")
        error.wait_for(state="visible")
        assert "Token refused" in error.inner_text() and "unknown bearer token" in error.inner_text()
        assert page.locator("#main").is_hidden()

        page.fill("#token", READ_TOKEN)
        page.click("#login-form button")
        page.wait_for_selector("#map .cell")
        assert page.locator("#login").is_hidden()
        page.evaluate("() => { location.hash = '#partitions'; }")
        page.wait_for_selector("#partitions-table > tbody > tr")
        assert page.locator("#partitions-table > tbody > tr").count() == 8
        page.wait_for_function("() => document.querySelector('#conn').textContent.includes('live')")

        storage = page.evaluate("() => ({session: {...sessionStorage}, local: localStorage.length, cookies: document.cookie})")
        assert list(storage["session"].values()) == [READ_TOKEN]
        assert storage["local"] == 0 and storage["cookies"] == ""
        assert READ_TOKEN not in page.url
        assert requests and all(READ_TOKEN not in r.url for r in requests)
        authorised = [r for r in requests if "/ui/api/overview" in r.url or "/events" in r.url]
        assert authorised and any(r.headers.get("authorization") == f"Bearer {READ_TOKEN}" for r in authorised)
        assert any("/events" in r.url for r in authorised), "the event feed was not opened"
    finally:
        context.close()
    # a new tab (new context: new session storage) starts signed out again
    fresh = browser.new_context()
    try:
        other = fresh.new_page()
        other.goto(node.url + "/ui/")
        other.wait_for_selector("#login:not([hidden])")
    finally:
        fresh.close()
