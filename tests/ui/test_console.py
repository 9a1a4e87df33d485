"""The console in a real headless Chromium against a real ``upr server`` (no tokens).

What a person sees is asserted: the partition table's numbers equal ``GET /partitions``, a
consumer shows up with its lag, a write moves the numbers without a reload, a SIGKILL shows
"connection lost" and, after the restart, the unclean-restart event and the new failover entries.
The tests share one server and one tab and run in file order (the restart is last).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import ServerProcess, start_server
from tests.support.wsclient import RawStream, write_docs
from tests.ui.conftest import LoopThread

pytestmark = pytest.mark.slow

PARTITIONS = 16
DEADLINE_S = 20.0

TABLE_JS = """() => Object.fromEntries([...document.querySelectorAll('#partitions-table > tbody > tr')].map(tr => [
  tr.dataset.partition,
  Object.fromEntries([...tr.querySelectorAll(':scope > [data-key]')].map(c => [c.dataset.key, c.dataset.value ?? c.textContent]))]))"""


@dataclass
class Node:
    workdir: Path
    server: ServerProcess

    @property
    def url(self) -> str:
        return self.server.url

    def get(self, path: str) -> Any:
        return httpx.get(self.url + path, timeout=10).json()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = tmp_path_factory.mktemp("console") / "upr"
    n = Node(workdir, start_server(workdir, partitions=PARTITIONS))
    yield n
    n.server.kill()


@pytest.fixture(scope="module")
def page(browser: Any, node: Node) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(node.url + "/ui/")
    tab.wait_for_selector("#map .cell")
    tab.evaluate("() => { window.__sameDocument = true; }")  # gone if the page ever reloads
    yield tab
    context.close()
    assert errors == [], errors


def until(what: str, check: Callable[[], Any], timeout: float = DEADLINE_S) -> Any:
    """Poll ``check`` until it returns something truthy (the console refreshes once a second)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what}: not seen in {timeout:.0f}s (last: {last!r})")


def until_no_diffs(what: str, diffs: Callable[[], list[str]], timeout: float = DEADLINE_S) -> None:
    last: list[str] = []

    def check() -> bool:
        nonlocal last
        last = diffs()
        return not last

    try:
        until(what, check, timeout)
    except AssertionError:
        raise AssertionError(f"{what}: still differs after {timeout:.0f}s: {last[:8]}") from None


def show(page: Any, name: str) -> None:
    page.evaluate(f"() => {{ location.hash = '#{name}'; }}")
    page.wait_for_selector(f"#page-{name}:not([hidden])")


def table_matches(page: Any, node: Node) -> list[str]:
    """Differences between the page's partition table and ``GET /partitions`` (empty: equal)."""
    api = {str(p["partition"]): p for p in node.get("/partitions")["partitions"]}
    shown = page.evaluate(TABLE_JS)
    diffs = []
    if set(shown) != set(api):
        return [f"partitions shown {sorted(shown)} != {sorted(api)}"]
    for pid, p in api.items():
        row = shown[pid]
        for key in ("high_seqno", "persisted_seqno", "purge_seqno", "queue_depth", "item_count"):
            if int(row[key]) != p[key]:
                diffs.append(f"partition {pid} {key}: page {row[key]} != api {p[key]}")
        if row["state"] != p["state"]:
            diffs.append(f"partition {pid} state: page {row['state']} != api {p['state']}")
        entries = f"{len(p['failover_log'])} entr{'y' if len(p['failover_log']) == 1 else 'ies'} (uuid {p['uuid']})"
        if entries not in row["failover_log"]:
            diffs.append(f"partition {pid} failover log: page {row['failover_log']!r}, api {entries!r}")
    return diffs


def test_partition_table_equals_the_partitions_endpoint(page: Any, node: Node) -> None:
    write_docs(node.url, {f"doc-{i}": b"x" * 50 for i in range(300)}, durability="persist")
    write_docs(node.url, {f"doc-{i}": None for i in range(20)}, durability="persist")  # tombstones
    show(page, "partitions")
    assert page.locator("#partitions-table > thead th").count() == 9
    until_no_diffs("the table equal to GET /partitions", lambda: table_matches(page, node))
    # sortable: high seqno descending puts the largest first
    page.click("#partitions-table th[data-key=high_seqno] button")
    page.click("#partitions-table th[data-key=high_seqno] button")
    highs = [int(v) for v in page.eval_on_selector_all(
        "#partitions-table tbody td[data-key=high_seqno]", "cells => cells.map(c => c.dataset.value)")]
    assert highs == sorted(highs, reverse=True)
    # the failover log expands and stays expanded across refreshes
    page.click("#partitions-table tbody tr:first-child details summary")
    time.sleep(1.5)
    assert page.locator("#partitions-table tbody tr:first-child details[open] table tbody tr").count() >= 1


def test_a_consumer_appears_with_its_lag(page: Any, node: Node, loop_thread: LoopThread) -> None:
    write_docs(node.url, {f"big-{i}": b"v" * 400 for i in range(1500)})
    # a consumer that takes one window of data and stops acknowledging: it stays behind
    consumer = loop_thread.run(RawStream.open(node.url, name="ui-consumer", codec="json", window=65536,
                                              auto_ack=False))
    loop_thread.run(consumer.stream(range(PARTITIONS)))
    # and one that asks to resume a history this node never had: told to roll back
    stranger = loop_thread.run(RawStream.open(node.url, name="ui-stranger", partitions=[0]))
    loop_thread.run(stranger.send({"type": "stream_request", "partition": 0, "uuid": 424242, "start_seqno": 5,
                                   "snap_start": 5, "snap_end": 5}))
    answer = loop_thread.run(stranger.responses(1))[0]
    assert answer["status"] == "rollback" and answer["reason"] == "unknown_uuid", answer
    write_docs(node.url, {f"after-{i}": b"a" for i in range(40)})  # changes it has been told of, not sent
    try:
        show(page, "streams")
        card = page.locator("article[data-stream=ui-consumer]")
        card.wait_for(timeout=DEADLINE_S * 1000)

        def lag_diffs() -> list[str]:
            api = next(s for s in node.get("/streams")["streams"] if s["name"] == "ui-consumer")
            highs = {p["partition"]: p["high_seqno"] for p in node.get("/partitions")["partitions"]}
            want = {str(p["partition"]): highs[p["partition"]] - p["last_sent_seqno"] for p in api["partitions"]}
            shown = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
                'article[data-stream=ui-consumer] tbody tr')].map(tr => [tr.dataset.partition,
                Number(tr.querySelector('[data-key=lag]').textContent.replaceAll(',', ''))]))""")
            if sum(want.values()) == 0:
                return [f"no lag yet: {want}"]
            return [] if shown == want else [f"page {shown} != api {want}"]

        until_no_diffs("the consumer's per-partition lag equal to GET /streams", lag_diffs)
        lag_seconds = card.locator("td[data-key=lag_s]").all_inner_texts()
        assert any(t[0].isdigit() and float(t) > 0 for t in lag_seconds), lag_seconds
        assert "consumer" in card.locator(".badge").inner_text()
        assert card.locator("dd[data-field=codec]").inner_text() == "json"
        assert "64.0 KiB" in card.locator("dd[data-field=window]").inner_text()
        show(page, "events")
        rollback = page.locator("#event-list li[data-kind=rollback]").first
        rollback.wait_for(timeout=DEADLINE_S * 1000)
        assert "ui-stranger" in rollback.inner_text() and "unknown_uuid" in rollback.inner_text()
        assert "warning" in rollback.locator(".badge").inner_text()  # severity in words, not colour only
    finally:
        loop_thread.run(consumer.close())
        loop_thread.run(stranger.close())


def test_a_write_moves_the_numbers_without_a_reload(page: Any, node: Node) -> None:
    show(page, "overview")
    items = page.locator("[data-card=Items] .v")
    before = node.get("/status")["totals"]["items"]
    until("the items card showing GET /status", lambda: items.inner_text().replace(",", "") == str(before))
    write_docs(node.url, {f"moving-{i}": b"m" for i in range(7)})
    after = node.get("/status")["totals"]["items"]
    assert after == before + 7
    until("the items card moving on its own", lambda: items.inner_text().replace(",", "") == str(after))
    assert page.evaluate("() => window.__sameDocument === true"), "the page reloaded"
    assert "live" in page.locator("#conn").inner_text()


@pytest.mark.parametrize("size", [(1280, 800), (390, 844)], ids=["1280x800", "narrow"])
def test_every_page_fits_and_says_state_in_words(page: Any, node: Node, size: tuple[int, int]) -> None:
    page.set_viewport_size({"width": size[0], "height": size[1]})
    try:
        for name in ("overview", "partitions", "streams", "events"):
            show(page, name)
            page.wait_for_timeout(300)
            overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"{name} at {size}: {overflow}px wider than the window"
            for table in page.locator(f"#page-{name} table:visible").all():
                assert table.locator("thead th").count() > 0, f"{name}: a table without headers"
        show(page, "partitions")
        states = page.eval_on_selector_all("#partitions-table tbody td[data-key=state]", "cs => cs.map(c => c.textContent)")
        assert states and all("active" in s for s in states)
        show(page, "overview")
        assert page.locator("#map .cell").first.inner_text() == "A"
    finally:
        page.set_viewport_size({"width": 1280, "height": 800})


def test_sigkill_shows_connection_lost_then_the_unclean_restart(page: Any, node: Node) -> None:
    write_docs(node.url, {f"late-{i}": b"l" for i in range(50)})
    port = node.url.rsplit(":", 1)[1]
    node.server.kill()
    conn = page.locator("#conn")
    until("the page saying the connection is lost", lambda: "connection lost" in conn.inner_text())
    assert "lost" in (conn.get_attribute("class") or "")
    node.server = start_server(node.workdir, data_dir=node.server.data_dir, partitions=PARTITIONS,
                               args=["--port", port])
    assert node.url.endswith(":" + port)
    until("the page live again", lambda: "live" in conn.inner_text())
    show(page, "events")
    event = page.locator("#event-list li[data-kind=unclean_restart]")
    event.wait_for(timeout=DEADLINE_S * 1000)
    assert f"new failover entry in {PARTITIONS} partition(s)" in event.inner_text()
    assert "error" in event.locator(".badge").inner_text()
    show(page, "partitions")
    until_no_diffs("the new failover entries in the table", lambda: table_matches(page, node))
    logs = [p["failover_log"] for p in node.get("/partitions")["partitions"]]
    assert all(len(log) == 2 for log in logs)  # the restart began a new branch in every partition
