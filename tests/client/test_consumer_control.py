"""What the caller controls, against real server processes: "until now" ends lowered after an unclean
restart."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from clients import Consumer, HttpApi, Mutation, StreamEnd
from clients.backoff import Backoff
from tests.client.test_consumer import apply, bulk, sets
from tests.client.test_mirror import free_port
from tests.conftest import start_server

pytestmark = pytest.mark.slow

BIG = "x" * 1500  # with a 4 KiB window the server sends two or three items ahead of the consumer


def big_sets(prefix: str, n: int) -> list[dict]:
    return [{"op": "set", "key": f"{prefix}{i}", "value": f"{BIG}{i}"} for i in range(n)]


def server_docs(url: str, keys) -> dict[str, bytes]:
    with HttpApi(url) as api:
        return {k: d.value for k in keys if (d := api.get(k)) is not None}


def crashable(tmp_path: Path):
    args = ["--port", str(free_port()), "--flush-interval-ms", "60000"]
    return start_server(tmp_path / "srv", partitions=1, args=args), args


def restart(tmp_path: Path, srv, args):
    srv.kill()  # SIGKILL: the memory-only mutations are lost, a new history branch starts
    return start_server(tmp_path / "srv", data_dir=srv.data_dir, partitions=1, args=args)


async def test_until_now_end_is_lowered_when_an_unclean_restart_lost_the_goal(tmp_path):
    srv, args = crashable(tmp_path)
    try:
        bulk(srv.url, big_sets("p", 20), "persist")
        bulk(srv.url, big_sets("m", 20), "memory")
        consumer = Consumer(srv.url, partitions=[0], start="beginning", until_now=True, window_bytes=4096,
                            backoff=Backoff(0.05, 0.3))
        events: list = []
        async with consumer:
            it = consumer.__aiter__()
            while sum(isinstance(e, Mutation) for e in events) < 5:
                events.append(await it.__anext__())
            assert consumer.session.end_seqnos == {0: 40}
            srv = await asyncio.to_thread(restart, tmp_path, srv, args)

            async def rest() -> None:
                async for ev in it:
                    events.append(ev)

            await asyncio.wait_for(rest(), 30)  # before the fix: waits for seqno 40 forever
        end = [e for e in events if isinstance(e, StreamEnd)]
        assert [(e.reason, e.lowered_from) for e in end] == [("end_seqno_reached", 40)]
        assert consumer.session.end_seqnos == {0: 20} and consumer.reconnects >= 1
        docs: dict[str, bytes] = {}
        apply(events, docs)
        keys = [f"{t}{i}" for t in "pm" for i in range(20)]
        assert docs == server_docs(srv.url, keys) and len(docs) == 20  # the lost branch's keys were undone
    finally:
        srv.kill()
