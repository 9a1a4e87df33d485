"""``GET /events`` and ``GET /ui/api/overview`` in-process (real app and LMDB engine, no socket)."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx

from app import events as ev
from tests.support.asgi import InProcessApp


async def test_a_long_poll_is_answered_when_an_event_is_recorded(asgi_app: InProcessApp) -> None:
    client = asgi_app.client
    first = (await client.get("/events")).json()
    waiting = asyncio.ensure_future(client.get(f"/events?since={first['last_id']}&log={first['log_id']}",
                                               headers={"Prefer": "wait=20"}))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # nothing new: it waits
    log: ev.EventLog = asgi_app.app.state.events
    recorder = threading.Thread(target=log.record, args=(ev.EventKind.FLUSH_ERROR, "disk full on test"),
                                kwargs={"severity": ev.Severity.ERROR})
    recorder.start()  # recorded from another thread, as the flusher's faults are
    answer = (await asyncio.wait_for(waiting, 10)).json()  # well before its 20 s
    recorder.join()
    assert [e["message"] for e in answer["events"]] == ["disk full on test"]
    assert answer["last_id"] == first["last_id"] + 1 and answer["log_id"] == first["log_id"]


async def test_events_refuse_unknown_parameters_and_another_logs_id_resets(asgi_app: InProcessApp) -> None:
    client = asgi_app.client
    r = await client.get("/events?sinse=3")
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert "sinse" in r.json()["detail"]
    asgi_app.app.state.events.record(ev.EventKind.STATE, "one")
    r = await client.get("/events?since=5&log=0123456789abcdef")
    body = r.json()
    assert body["reset"] is True and [e["message"] for e in body["events"]] == ["one"]


async def test_overview_numbers_are_those_of_the_node(asgi_app: InProcessApp) -> None:
    client = asgi_app.client
    await client.put("/docs/a", content=b"1")
    await asgi_app.app.state.console_monitor.tick()
    overview = (await client.get("/ui/api/overview")).json()
    partitions = (await client.get("/partitions")).json()["partitions"]
    assert overview["partition_count"] == len(partitions) == 8
    for shown, api in zip(overview["partitions"], partitions):
        assert shown["high_seqno"] == api["high_seqno"] and shown["uuid"] == str(api["uuid"])
    assert overview["totals"]["items"] == 1 and overview["cluster"] is None
    page = await client.get("/ui/")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    assert (await client.get("/ui/static/console.js")).status_code == 200
    assert (await client.get("/ui", follow_redirects=False)).headers["location"] == "/ui/"


async def test_overview_and_events_need_the_read_role(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from app.auth import TokenTable
    from tests.support.asgi import in_process_app

    tokens = TokenTable.load(None, "reader-token=read")
    async with in_process_app(tmp_path / "d", tokens=tokens) as inproc:
        client: httpx.AsyncClient = inproc.client
        assert (await client.get("/ui/")).status_code == 200  # the page itself carries no data
        for path in ("/ui/api/overview", "/events"):
            assert (await client.get(path)).status_code == 401
            assert (await client.get(path, headers={"Authorization": "Bearer nope"})).status_code == 401
            assert (await client.get(path, headers={"Authorization": "Bearer reader-token"})).status_code == 200


async def test_closing_the_feed_answers_waiting_readers_at_once(asgi_app: InProcessApp) -> None:
    """Shutdown closes the feed: a reader waiting must be answered then, not hold the node's exit
    for its whole wait, and a reader arriving after is not let wait."""
    client = asgi_app.client
    first = (await client.get("/events")).json()
    query = f"/events?since={first['last_id']}&log={first['log_id']}"
    waiting = asyncio.ensure_future(client.get(query, headers={"Prefer": "wait=20"}))
    feed = asgi_app.app.state.event_feed
    deadline = time.monotonic() + 10
    while not feed.waiters and time.monotonic() < deadline:  # until the reader waits in the feed
        await asyncio.sleep(0.01)
    assert feed.waiters == 1 and not waiting.done()
    feed.close()
    answer = await asyncio.wait_for(waiting, 10)  # well before its 20 s
    assert answer.status_code == 200 and answer.json()["events"] == []
    later = await asyncio.wait_for(client.get(query, headers={"Prefer": "wait=20"}), 10)
    assert later.status_code == 200 and feed.waiters == 0
