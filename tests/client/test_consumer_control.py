"""What the caller controls, against real server processes: "until now" ends lowered after an unclean
restart, the "report" rollback policy with ``seek``, seeks of streaming partitions, bulk writes."""
from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from clients import (
    AsyncHttpApi,
    Consumer,
    HttpApi,
    HttpError,
    Mutation,
    PartitionReset,
    Rollback,
    StreamEnd,
    StreamOffset,
)
from clients.backoff import Backoff
from tests.support.docs import apply, bulk, sets
from tests.support.net import free_port
from tests.support.server import start_server

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

            await asyncio.wait_for(rest(), 30)  # an end left at 40 would wait for seqno 40 forever
        end = [e for e in events if isinstance(e, StreamEnd)]
        assert [(e.reason, e.lowered_from) for e in end] == [("end_seqno_reached", 40)]
        assert consumer.session.end_seqnos == {0: 20} and consumer.reconnects >= 1
        docs: dict[str, bytes] = {}
        apply(events, docs)
        keys = [f"{t}{i}" for t in "pm" for i in range(20)]
        assert docs == server_docs(srv.url, keys) and len(docs) == 20  # the lost branch's keys were undone
    finally:
        srv.kill()


async def test_report_policy_lets_the_caller_restart_where_it_holds_an_exact_state(tmp_path):
    srv, args = crashable(tmp_path)
    try:
        bulk(srv.url, sets("p", 20), "persist")
        bulk(srv.url, sets("m", 20), "memory")
        async with Consumer(srv.url, partitions=[0], start="beginning", until_now=True) as first:
            async for _ in first:
                pass
            saved = first.position(0)
        assert saved.seqno == 40
        srv = await asyncio.to_thread(restart, tmp_path, srv, args)
        bulk(srv.url, sets("n", 5), "persist")  # seqnos 21..25 on the new branch

        async def run(seek_to: StreamOffset | None) -> tuple[list, Consumer]:
            seen: list = []
            consumer = Consumer(srv.url, partitions=[0], offsets={0: saved}, until_now=True, ring_size=0,
                                on_rollback="report")
            async with consumer:
                async for ev in consumer:
                    seen.append(ev)
                    if isinstance(ev, Rollback) and seek_to is not None:
                        consumer.seek(0, seek_to)  # java-dcp-client's rollbackAndRestartStream
            return seen, consumer

        seen, consumer = await asyncio.wait_for(run(None), 30)
        rollbacks = [e for e in seen if isinstance(e, Rollback)]
        assert len(rollbacks) == 1 and rollbacks[0].seqno == 20 and rollbacks[0].corrections == 0
        assert rollbacks[0].resume is not None and rollbacks[0].resume.seqno == 20
        items = [e for e in seen if isinstance(e, Mutation)]
        assert not any(e.correction for e in items) and not any(isinstance(e, PartitionReset) for e in seen)
        assert [e.seqno for e in items] == [21, 22, 23, 24, 25]  # resumed at the rollback point
        assert (consumer.rollbacks, consumer.resets) == (1, 0)

        seen, consumer = await asyncio.wait_for(run(StreamOffset.at(saved.uuid, 10)), 30)
        items = [e for e in seen if isinstance(e, Mutation)]
        assert [e.seqno for e in items] == list(range(11, 26))  # restarted where the caller chose
        assert consumer.position(0).seqno == 25
    finally:
        srv.kill()


async def test_seek_of_a_streaming_partition_restarts_it(upr_server):
    srv = upr_server(partitions=2)
    bulk(srv.url, sets("k", 40))
    seqnos: list[tuple[int, int]] = []
    consumer = Consumer(srv.url, partitions=[0, 1], start="beginning", until_now=True, window_bytes=4096,
                        backoff=Backoff(0.01, 0.05))
    async with consumer:
        async for ev in consumer:
            if isinstance(ev, Mutation):
                seqnos.append((ev.partition, ev.seqno))
                if len(seqnos) == 3:
                    consumer.seek(ev.partition, StreamOffset())
    assert consumer.reconnects == 1
    again = [s for s in seqnos[3:] if s[0] == seqnos[0][0]]
    assert again[0][1] == 1  # the partition came again from its first item
    ends = {p: consumer.position(p).seqno for p in (0, 1)}
    highs = {int(i["partition"]): int(i["high_seqno"]) for i in HttpApi(srv.url).partitions()}
    assert ends == highs


async def test_seek_from_another_task_wakes_an_idle_stream(upr_server):
    srv = upr_server(partitions=1)
    bulk(srv.url, sets("k", 10))
    seen: list[int] = []
    consumer = Consumer(srv.url, start="beginning", backoff=Backoff(0.01, 0.05))  # endless: idle after 10
    async with consumer:
        async def consume() -> None:
            async for ev in consumer:
                if isinstance(ev, Mutation):
                    seen.append(ev.seqno)

        task = asyncio.create_task(consume())
        while len(seen) < 10:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the stream now waits for a frame that does not come
        consumer.seek(0, StreamOffset.at(consumer.position(0).uuid, 4))
        async with asyncio.timeout(10):
            while len(seen) < 16:
                await asyncio.sleep(0.01)
        task.cancel()
    assert seen == list(range(1, 11)) + list(range(5, 11))


async def test_bulk_both_flavours_and_single_partition_lookup(upr_server):
    srv = upr_server(partitions=2)
    with HttpApi(srv.url) as api:
        out = api.bulk([{"op": "set", "key": "a", "value": "1"}, {"op": "set", "key": "b", "value_b64": "Mg=="}],
                       durability="persist")
        assert out["succeeded"] == 2 and [r["status"] for r in out["results"]] == [200, 200]
        out = api.bulk(iter([{"op": "delete", "key": "a"}, {"op": "delete", "key": "zz"}]), ndjson=True)
        assert [r["status"] for r in out["results"]] == [200, 404] and out["failed"] == 1
        assert api.get("a") is None and api.get("b").value == b"2"
        out = api.bulk([{"op": "frobnicate", "key": "a"}, {"op": "set", "key": "d", "value": 4}])
        assert [r["status"] for r in out["results"]][1] == 200 and out["failed"] == 1  # one bad item only
        with pytest.raises(HttpError) as err:
            api.bulk([], ndjson=True)  # an empty body is a request-level problem
        assert err.value.status == 422 and err.value.field == "body"
    async with AsyncHttpApi(srv.url) as aapi:
        out = await aapi.bulk([{"op": "set", "key": "c", "value": 3}], ndjson=True)
        p = out["results"][0].get("partition", (await aapi.get("c")).partition)
        info = await aapi.partition(p)
        assert info["high_seqno"] >= 1 and info["failover_log"]
        assert (await aapi.get("c")).value == b"3"
        with pytest.raises(HttpError) as err:
            await aapi.partition(99)
        assert err.value.status in (404, 422)
    assert httpx.get(f"{srv.url}/docs/c").content == b"3"
