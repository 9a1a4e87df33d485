"""Consumer against a real server process: modes, resume, batches, barrier, flow control, errors."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from clients import (
    AuthFailed,
    BarrierReached,
    Consumer,
    Deletion,
    FileStateStore,
    MemoryStateStore,
    Mutation,
    SnapshotEnd,
    SnapshotStart,
    StreamEnd,
    StreamOffset,
    StreamRejected,
    SyncConsumer,
)
from clients.backoff import Backoff
from engine.protocol.frames import ItemBatch
from tests.support.docs import apply, bulk, sets

pytestmark = pytest.mark.slow

PARTITIONS = 4


@pytest.fixture
def server(upr_server):
    return upr_server(partitions=PARTITIONS)


async def collect(consumer: Consumer) -> list:
    out = []
    async with consumer:
        async for ev in consumer:
            out.append(ev)
    return out


async def test_until_now_from_the_beginning_brackets_snapshots_and_ends(server):
    bulk(server.url, sets("k", 200))
    bulk(server.url, [{"op": "delete", "key": f"k{i}"} for i in range(0, 200, 5)])
    bulk(server.url, sets("k", 50, tag="w"))
    store = MemoryStateStore()
    events = await collect(Consumer(server.url, start="beginning", until_now=True, state=store))
    docs: dict[str, bytes] = {}
    apply(events, docs)
    expected = {f"k{i}": (b'"w%d"' % i if i < 50 else b'"v%d"' % i) for i in range(200) if i >= 50 and i % 5 or i < 50}
    assert docs == expected
    ends = [e for e in events if isinstance(e, StreamEnd)]
    assert sorted(e.partition for e in ends) == list(range(PARTITIONS))
    assert {e.reason for e in ends} == {"end_seqno_reached"}
    open_snap: dict[int, SnapshotStart] = {}
    for ev in events:  # every item sits inside a snapshot of its partition, in seqno order
        if isinstance(ev, SnapshotStart):
            assert ev.partition not in open_snap
            open_snap[ev.partition] = ev
        elif isinstance(ev, (Mutation, Deletion)):
            snap = open_snap[ev.partition]
            assert snap.start <= ev.seqno <= snap.end
        elif isinstance(ev, SnapshotEnd):
            del open_snap[ev.partition]
    highs = {p["partition"]: p["high_seqno"] for p in httpx.get(f"{server.url}/partitions").json()["partitions"]}
    assert {p: cp.offset.seqno for p, cp in store.state.partitions.items()} == highs
    assert all(cp.offset.complete for cp in store.state.partitions.values())


async def test_resume_from_saved_state_prints_only_what_changed(server, tmp_path):
    bulk(server.url, sets("a", 40))
    first = await collect(Consumer(server.url, start="saved", state=FileStateStore(tmp_path), until_now=True))
    assert len([e for e in first if isinstance(e, Mutation)]) == 40
    bulk(server.url, sets("b", 7) + [{"op": "delete", "key": "a3"}])
    second = await collect(Consumer(server.url, start="saved", state=tmp_path, until_now=True))
    changed = sorted(e.key for e in second if isinstance(e, (Mutation, Deletion)))
    assert changed == sorted([f"b{i}" for i in range(7)] + ["a3"])
    third = await collect(Consumer(server.url, start="saved", state=tmp_path, until_now=True))
    assert not [e for e in third if isinstance(e, (Mutation, Deletion))]


async def test_break_leaves_the_unprocessed_item_for_next_time(server, tmp_path):
    bulk(server.url, sets("c", 30), durability="persist")
    seen = []
    async with Consumer(server.url, start="saved", state=tmp_path, partitions=[0, 1, 2, 3], until_now=True) as c:
        async for ev in c:
            if isinstance(ev, Mutation):
                seen.append(ev.key)
                if len(seen) == 10:
                    break  # the 10th was yielded, not processed: it must come again
    rest = await collect(Consumer(server.url, start="saved", state=tmp_path, until_now=True))
    again = [e.key for e in rest if isinstance(e, Mutation)]
    assert seen[-1] in again and set(seen[:-1]) | set(again) == {f"c{i}" for i in range(30)}


async def test_batches_fast_path_equals_events(server):
    bulk(server.url, sets("x", 300) + [{"op": "delete", "key": "x7"}])
    docs: dict[str, bytes] = {}
    async with Consumer(server.url, start="beginning", until_now=True, ring_size=0) as c:
        async for ev in c.batches():
            if type(ev) is ItemBatch:
                for key, _seqno, _cas, _rev, deleted, value in ev.rows():
                    if deleted:
                        docs.pop(key.decode(), None)
                    else:
                        docs[key.decode()] = value
    assert docs == {f"x{i}": b'"v%d"' % i for i in range(300) if i != 7}


async def test_from_now_sees_only_later_writes_and_barrier_from_another_task(server):
    bulk(server.url, sets("old", 20))
    got: list[str] = []
    consumer = Consumer(server.url, start="now", ring_size=0)

    async def consume() -> None:
        async for ev in consumer:
            if isinstance(ev, Mutation):
                await asyncio.sleep(0)  # a handler that yields to the loop
                got.append(ev.key)

    async with consumer:
        task = asyncio.create_task(consume())
        for round_ in range(3):
            await asyncio.to_thread(bulk, server.url, sets(f"new{round_}-", 50))
            reached = await consumer.barrier(timeout=20)
            assert isinstance(reached, BarrierReached)
            # every write acknowledged before the barrier was processed before it returned
            assert {f"new{round_}-{i}" for i in range(50)} <= set(got)
        task.cancel()
    assert not [k for k in got if k.startswith("old")]


async def test_explicit_offsets_and_end_seqnos(server):
    results = bulk(server.url, sets("e", 80), durability="persist")
    p = results[0]["partition"]
    mine = sorted(r["seqno"] for r in results if r["partition"] == p)
    info = httpx.get(f"{server.url}/partitions/{p}").json()
    uuid = info["failover_log"][0]["uuid"]
    start, end = mine[2], mine[-3]
    events = await collect(Consumer(server.url, partitions=[p], offsets={p: StreamOffset.at(uuid, start)},
                                    end_seqnos={p: end}, ring_size=0))
    seqnos = [e.seqno for e in events if isinstance(e, Mutation)]
    assert seqnos and min(seqnos) > start and end in seqnos
    assert [e.reason for e in events if isinstance(e, StreamEnd)] == ["end_seqno_reached"]


async def test_small_window_slow_handler_acks_every_byte_and_finishes(server):
    bulk(server.url, [{"op": "set", "key": f"w{i}", "value": "x" * 300} for i in range(1500)])
    consumer = Consumer(server.url, start="beginning", until_now=True, window_bytes=65536, ring_size=0)
    n = 0
    async with consumer:
        async for ev in consumer:
            if isinstance(ev, Mutation):
                n += 1
                if n % 100 == 0:
                    await asyncio.sleep(0.005)
    assert n == 1500
    # the server refuses over-acks (ack_exceeds_in_flight) and would stall on missing acks
    assert consumer.acks.acked_total > 1500 * 300


async def test_barrier_driven_by_a_handler_can_be_called_again(server):
    seen: list[object] = []
    async with Consumer(server.url, start="now", ring_size=0, handler=seen.append) as consumer:
        for round_ in range(3):
            bulk(server.url, sets(f"h{round_}-", 3))
            await consumer.barrier(timeout=20)  # the second call hung: the first left the iteration open
    assert {e.key for e in seen if isinstance(e, Mutation)} == {f"h{r}-{i}" for r in range(3) for i in range(3)}


def test_sync_consumer(server):
    bulk(server.url, sets("s", 25))
    docs: dict[str, bytes] = {}
    with SyncConsumer(server.url, start="beginning", until_now=True, ring_size=0) as c:
        apply(list(c), docs)
    assert len(docs) == 25
    seen = []
    with SyncConsumer(server.url, start="now", ring_size=0, handler=seen.append) as c:
        bulk(server.url, sets("t", 5))
        c.barrier(timeout=20)
    assert {e.key for e in seen if isinstance(e, Mutation)} == {f"t{i}" for i in range(5)}


async def test_auth_and_not_my_partition(upr_server):
    srv = upr_server(partitions=PARTITIONS, tokens={"admin-token": "admin", "read-token": "read"})
    with pytest.raises(AuthFailed):
        await Consumer(srv.url, token="wrong-token").connect()
    with pytest.raises(AuthFailed):
        await Consumer(srv.url).connect()
    admin = {"Authorization": "Bearer admin-token"}
    r = httpx.post(f"{srv.url}/admin/partitions/2/state", json={"state": "replica"}, headers=admin)
    assert r.status_code == 200, r.text
    consumer = Consumer(srv.url, token="read-token", partitions=[2], start="beginning",
                        backoff=Backoff(0.01, 0.05))
    with pytest.raises(StreamRejected) as info:
        await collect(consumer)
    assert info.value.status == "not_my_partition" and info.value.partition == 2
    ok = await collect(Consumer(srv.url, token="read-token", partitions=[1], until_now=True))
    assert [e.reason for e in ok if isinstance(e, StreamEnd)] == ["end_seqno_reached"]


async def test_close_from_another_task_stops_the_iteration(server):
    bulk(server.url, sets("z", 10))
    consumer = Consumer(server.url, start="beginning", ring_size=0, backoff=Backoff(0.01, 0.02))
    seen = []

    async def consume() -> None:
        async for ev in consumer:
            seen.append(ev)

    await consumer.connect()
    task = asyncio.create_task(consume())
    while len([e for e in seen if isinstance(e, Mutation)]) < 10:
        await asyncio.sleep(0.01)
    await consumer.close()
    await asyncio.wait_for(task, 5)  # ends, does not reconnect
    assert consumer.reconnects == 0


async def test_reconnects_with_backoff_after_a_server_restart(tmp_path):
    from tests.support.net import free_port
    from tests.support.server import start_server

    args = ["--port", str(free_port())]
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS, args=args)
    consumer = Consumer(srv.url, start="beginning", state=tmp_path / "st", backoff=Backoff(0.05, 0.3))
    docs: dict[str, bytes] = {}

    async def consume() -> None:
        async for ev in consumer:
            apply([ev], docs)

    try:
        async with consumer:
            task = asyncio.create_task(consume())
            await asyncio.to_thread(bulk, srv.url, sets("r", 30), "persist")
            await consumer.barrier(timeout=20)
            await asyncio.to_thread(srv.stop)  # graceful: streams end, close code 1001
            srv = await asyncio.to_thread(start_server, tmp_path / "srv", data_dir=srv.data_dir,
                                          partitions=PARTITIONS, args=args)
            await asyncio.to_thread(bulk, srv.url, sets("s", 30), "persist")
            await consumer.barrier(timeout=30)
            assert consumer.reconnects >= 1 and consumer.rollbacks == 0  # a clean stop loses nothing
            assert len(docs) == 60
            task.cancel()
    finally:
        srv.kill()


@pytest.mark.parametrize("mode", ["item", "snapshot"])
async def test_commit_modes(server, tmp_path, mode):
    results = bulk(server.url, sets("m", 120), durability="persist")
    p = results[0]["partition"]
    mine = {r["key"] for r in results if r["partition"] == p}
    assert len(mine) >= 30
    async with Consumer(server.url, start="saved", state=tmp_path, partitions=[p], until_now=True,
                        commit=mode) as c:
        n = 0
        async for ev in c:
            if isinstance(ev, Mutation):
                n += 1
                if n == 3:
                    await c.commit()  # "item": these 3 are applied; "snapshot": only whole snapshots count
                    break
    rest = await collect(Consumer(server.url, start="saved", state=tmp_path, partitions=[p], until_now=True))
    again = [e.key for e in rest if isinstance(e, Mutation) and not e.correction]
    if mode == "item":
        assert len(again) == len(mine) - 3
    else:
        assert set(again) == mine  # the partial snapshot was never claimed
