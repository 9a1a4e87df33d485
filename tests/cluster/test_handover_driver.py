"""Graceful failover's adapters against a real etcd and a real engine: the orchestrator's driver
stores refusals, creates records, switches the map under its election guard and calls off what
was withdrawn; a source node stops writes for its records and takes them again when a record
goes.  The data plane (streams, takeover) is covered end to end in test_graceful_failover_e2e."""
from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cluster.election import Election
from app.cluster.etcd import EtcdClient, Put
from app.cluster.handover import HandoverDriver, HandoverParticipant, HandoverStore
from app.cluster.layout import Layout
from app.cluster.mapstore import MapStore
from engine.cluster.handover import Handover, HandoverRequest
from engine.cluster.orchestration import ClusterView
from engine.cluster.partition_map import PartitionMap, Placement
from engine.cluster.promotion import ReplicaProgress
from engine.config import EngineConfig
from engine.core.errors import PartitionNotActive
from engine.core.types import Op, PartitionState, WriteOp
from engine.engine import Engine
from tests.cluster.etcd_server import EtcdProcess

MAP = PartitionMap(1, (Placement("a", ("b",)), Placement("b", ("a",)), Placement("a", ("c",))))


@contextlib.contextmanager
def _engine_of(tmp_path: Path, node: str) -> Iterator[Engine]:
    """An engine of three partitions in the states MAP gives ``node``."""
    with Engine.open(EngineConfig(data_dir=tmp_path, partitions=3)) as engine:
        for p in range(3):
            engine.set_state(p, PartitionState.ACTIVE if MAP.active_of(p) == node else PartitionState.REPLICA)
        yield engine


def _three_writes_to_partition_0(engine: Engine) -> None:
    """Seqnos 1-3 of partition 0, all to one key."""
    key = next(f"k{i}" for i in range(1000) if engine.partition_of(f"k{i}") == 0)
    for i in range(3):
        engine.write(WriteOp(Op.MUTATION, key, b"v%d" % i))


def _source_acked_by_b(client: EtcdClient, layout: Layout, engine: Engine, held: dict[str, int],
                       **options: float) -> tuple[HandoverParticipant, list]:
    """Node "a" as a handover's source whose target "b" has acknowledged ``held["b"]`` of
    partition 0 (read at each look), and the ack listeners it registered, for the test to call."""
    listeners: list = []
    node = HandoverParticipant(client, layout, engine, "a", acked=lambda n, p: held.get(n) if p == 0 else None,
                               on_ack=lambda fn: listeners.append(fn) or (lambda: None), **options)
    return node, listeners
LIVE = frozenset({"a", "b", "c"})


@pytest.fixture
async def client(etcd: EtcdProcess):
    c = EtcdClient([etcd.url])
    yield c
    await c.aclose()


async def orchestrator(client: EtcdClient, layout: Layout) -> tuple[HandoverDriver, MapStore]:
    """A driver holding the orchestrator key (its guard), and the map at revision 1."""
    lease, _ttl = await client.grant(30)
    election = Election(client, layout, "b", lease)
    await election.campaign()
    maps = MapStore(client, layout)
    assert await maps.publish(MAP, 0)
    return HandoverDriver(client, layout, maps, election.guard), maps


async def test_the_driver_refuses_starts_switches_and_calls_off(client: EtcdClient) -> None:
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    driver, maps = await orchestrator(client, layout)
    store = HandoverStore(client, layout)

    async def cycle(progress: dict) -> PartitionMap:
        current, mod = await maps.load(3)
        await driver.cycle(ClusterView(current, LIVE, 1, progress), mod)
        return (await maps.load(3))[0]

    behind = {(0, "b"): ReplicaProgress(10, True), (2, "c"): ReplicaProgress(4, False)}
    await store.ask(HandoverRequest("a"))
    await cycle(behind)
    refused = (await store.requests())["a"]
    assert refused.refused is not None and "partition 2: no replica is in sync" in refused.refused
    assert await store.records() == {}

    await store.ask(HandoverRequest("a"))  # asked again once c caught up
    in_sync = {(0, "b"): ReplicaProgress(10, True), (2, "c"): ReplicaProgress(7, True)}
    assert await cycle(in_sync) == MAP
    records = await store.records()
    assert {p: s.handover for p, s in records.items()} == {0: Handover(0, "a", "b"), 2: Handover(2, "a", "c")}

    for p, seqno in ((0, 10), (2, 9)):  # what the source does once its writes stopped
        assert await store.update(records[p], records[p].handover.fenced(seqno))
    switched = await cycle(in_sync)  # b holds 10 of 10, c only 7 of 9
    assert switched.revision == 2 and switched.placements[0] == Placement("b", ("a",))
    assert switched.placements[2] == MAP.placements[2]

    await store.withdraw("a")  # 2 is called off (not switched yet); 0 is past undoing
    assert await cycle(in_sync) == switched
    assert set(await store.records()) == {0}

    await client.delete(layout.orchestrator)  # no longer the orchestrator: its writes are refused
    await store.ask(HandoverRequest("a"))
    assert await cycle(in_sync) == switched
    assert set(await store.records()) == {0}


async def test_a_source_stops_writes_for_its_records_and_takes_them_again_when_called_off(
        client: EtcdClient, tmp_path: Path) -> None:
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    store = HandoverStore(client, layout)
    with _engine_of(tmp_path, "a") as engine:
        key = next(f"k{i}" for i in range(1000) if engine.partition_of(f"k{i}") == 0)
        seqno = engine.write(WriteOp(Op.MUTATION, key, b"v")).seqno
        node = HandoverParticipant(client, layout, engine, "a")
        await client.put(store.record_key(0), json.dumps(Handover(0, "a", "b").to_json()).encode())
        await node.load()
        await node.follow(MAP)
        await node.fenced()
        assert engine.writes_stopped(0) and not engine.writes_stopped(2)
        assert (await store.records())[0].handover.fenced_at == seqno
        with pytest.raises(PartitionNotActive):
            engine.write(WriteOp(Op.MUTATION, key, b"lost?"))
        await client.delete(store.record_key(0))  # called off
        await node.load()
        await node.follow(MAP)
        assert not engine.writes_stopped(0)
        assert engine.write(WriteOp(Op.MUTATION, key, b"again")).seqno == seqno + 1


async def test_a_source_whose_target_acknowledged_the_fence_switches_the_map_in_the_same_write(
        client: EtcdClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    store, maps = HandoverStore(client, layout), MapStore(client, layout)
    assert await maps.publish(MAP, 0)
    with _engine_of(tmp_path, "a") as engine:
        _three_writes_to_partition_0(engine)
        held = {"b": 2}  # the target acknowledged all but the last item so far
        node, listeners = _source_acked_by_b(client, layout, engine, held, catch_up_items=0, ack_wait_s=5.0)
        await client.put(store.record_key(0), json.dumps(Handover(0, "a", "b", kind="rebalance").to_json()).encode())
        published: list[tuple[bytes, int]] = []
        node.on_switched = lambda raw, revision: published.append((raw, revision))
        # while etcd commits the switch, a write refused here already goes on to the target
        in_flight: list[tuple[str | None, bool]] = []
        real_txn = node.switch_etcd.txn  # the switch's own connection (``EtcdThread``)

        async def txn(compares, ops, failure=(), *, marks=None):  # type: ignore[no-untyped-def]
            refused_now = asyncio.create_task(node.until_settled(0, 10.0))
            await asyncio.sleep(0.05)
            in_flight.append((node.switching_to(0), refused_now.done() and refused_now.result()))
            return await real_txn(compares, ops, failure, marks=marks)
        monkeypatch.setattr(node.switch_etcd, "txn", txn)
        await node.load()
        await node.follow(MAP)
        await asyncio.sleep(0.1)
        assert not engine.writes_stopped(0)  # held back: the target is one item behind
        held["b"] = 3
        for fn in listeners:
            fn(0)  # the ack arrives: the fence goes on, and the target holds the fenced seqno at once
        for _ in range(100):
            if engine.writes_stopped(0):
                break
            await asyncio.sleep(0.01)
        waiting = asyncio.create_task(node.until_settled(0, 10.0))  # a write refused by the fence
        await node.fenced()
        record = (await store.records())[0].handover
        assert (record.fenced_at, record.acked) == (3, 3)
        switched, mod = await maps.load(3)
        assert switched.revision == 2 and switched.placements[0] == Placement("b", ("a",))
        assert switched.placements[1:] == MAP.placements[1:]
        # the source knows the switch from its own write: the node is handed the map, and the
        # held write goes on to the target, neither waiting for the watch
        assert [(PartitionMap.from_json(json.loads(raw)), rev) for raw, rev in published] == [(switched, mod)]
        assert await asyncio.wait_for(waiting, 5.0)
        assert in_flight == [("b", True)]
        assert node.switching_to(0) is None  # answered: the map itself names the target now


async def test_a_switch_refused_because_another_moved_the_map_is_tried_again_on_that_map(
        client: EtcdClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    store, maps = HandoverStore(client, layout), MapStore(client, layout)
    assert await maps.publish(MAP, 0)
    # another source's switch (partition 2 to node c) lands between this node's reading of the
    # map and its transaction, as when a rebalance's sources switch side by side
    other = PartitionMap(2, (MAP.placements[0], MAP.placements[1], Placement("c", ("a",))))
    with _engine_of(tmp_path, "a") as engine:
        _three_writes_to_partition_0(engine)
        node, _listeners = _source_acked_by_b(client, layout, engine, {"b": 3}, catch_up_items=0, ack_wait_s=5.0)
        published: list[tuple[bytes, int]] = []
        node.on_switched = lambda raw, revision: published.append((raw, revision))
        real_txn = node.switch_etcd.txn
        calls: list[bool] = []

        async def txn(compares, ops, failure=(), *, marks=None):  # type: ignore[no-untyped-def]
            if not calls:
                await client.put(layout.map, json.dumps(other.to_json()).encode())
            answer = await real_txn(compares, ops, failure, marks=marks)
            calls.append(answer.succeeded)
            return answer
        monkeypatch.setattr(node.switch_etcd, "txn", txn)
        await client.put(store.record_key(0), json.dumps(Handover(0, "a", "b", kind="rebalance").to_json()).encode())
        await node.load()
        await node.follow(MAP)
        await node.fenced()
        assert calls == [False, True]  # refused once, then switched by the source itself
        switched, mod = await maps.load(3)
        assert switched.revision == 3
        assert switched.placements == (Placement("b", ("a",)), MAP.placements[1], Placement("c", ("a",)))
        assert [(PartitionMap.from_json(json.loads(raw)), rev) for raw, rev in published] == [(switched, mod)]
        record = (await store.records())[0].handover
        assert (record.fenced_at, record.acked) == (3, 3)


async def test_a_write_refused_during_its_handover_waits_until_the_map_names_the_target(
        client: EtcdClient, tmp_path: Path) -> None:
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    store = HandoverStore(client, layout)
    with _engine_of(tmp_path, "a") as engine:
        node = HandoverParticipant(client, layout, engine, "a")
        assert not await node.until_settled(0, 5.0)  # no handover: answered at once
        await client.put(store.record_key(0), json.dumps(Handover(0, "a", "b").to_json()).encode())
        await node.load()
        await node.follow(MAP)
        await node.fenced()
        assert engine.writes_stopped(0)
        assert not await node.until_settled(0, 0.05)  # still paused after the wait
        waiting = asyncio.create_task(node.until_settled(0, 10.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        # the switched map reaches the node (its watch), before the target took over: the write
        # goes on to the target now, which holds it until its takeover (``until_active``)
        node.map_seen(MAP.succeeded_by([Placement("b", ("a",)), *MAP.placements[1:]]))
        assert await asyncio.wait_for(waiting, 5.0)
        assert await node.until_settled(0, 10.0)  # and any later one at once


async def test_a_target_holds_a_write_between_the_fence_and_its_takeover(client: EtcdClient, tmp_path: Path) -> None:
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    store = HandoverStore(client, layout)
    with _engine_of(tmp_path, "b") as engine:
        target = HandoverParticipant(client, layout, engine, "b")
        await client.put(store.record_key(0), json.dumps(Handover(0, "a", "b").to_json()).encode())
        await target.load()
        # not fenced as this node sees it, yet held: the source sends writes here once it has
        # sent the switch, before this node sees the transaction that fences and switches
        assert target.taking_over(0)
        assert not await target.until_active(0, 0.05)  # bounded: then refused (a 421 to the source)
        await client.put(store.record_key(0), json.dumps(Handover(0, "a", "b", fenced_at=0).to_json()).encode())
        await target.load()
        assert target.taking_over(0)
        assert not await target.until_active(0, 0.05)  # bounded
        waiting = asyncio.create_task(target.until_active(0, 10.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        engine.set_state(0, PartitionState.ACTIVE)
        target.became_active(0)
        assert await asyncio.wait_for(waiting, 5.0)
        assert not target.taking_over(0)


async def test_a_target_follows_a_switched_map_with_the_fence_written_beside_it(
        client: EtcdClient, tmp_path: Path) -> None:
    """The node reads the map and the records at once: when the records' read ran before the
    source's transaction (fence and switched map in one write) and the map's after it, the
    records are read again, so the target takes over instead of promoting."""
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    store, maps = HandoverStore(client, layout), MapStore(client, layout)
    assert await maps.publish(MAP, 0)
    with _engine_of(tmp_path, "b") as engine:
        record = Handover(0, "a", "b")
        await client.put(store.record_key(0), json.dumps(record.to_json()).encode())
        target = HandoverParticipant(client, layout, engine, "b")
        await target.load()  # the records' read, before the switch
        _, mod = await maps.load(3)
        switched = MAP.succeeded_by([Placement("b", ("a",)), *MAP.placements[1:]])
        await client.txn([], [Put(store.record_key(0), json.dumps(record.fenced(0, 0).to_json()).encode()),
                              Put(layout.map, json.dumps(switched.to_json()).encode())])
        current, mod = await maps.load(3)  # the map's read, after it
        assert current.active_of(0) == "b" and not target.takes_over(0)
        await target.as_new_as(mod)
        assert target.takes_over(0)
        revision = target.revision
        await target.as_new_as(mod)  # as new already: no read
        assert target.revision == revision


async def test_an_acknowledgement_that_comes_late_still_lets_the_source_switch_the_map(
        client: EtcdClient, tmp_path: Path) -> None:
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    store, maps = HandoverStore(client, layout), MapStore(client, layout)
    assert await maps.publish(MAP, 0)
    with _engine_of(tmp_path, "a") as engine:
        _three_writes_to_partition_0(engine)
        held = {"b": 2}
        node, listeners = _source_acked_by_b(client, layout, engine, held, catch_up_items=8, ack_wait_s=0.05)
        await client.put(store.record_key(0), json.dumps(Handover(0, "a", "b", kind="rebalance").to_json()).encode())
        await node.load()
        await node.follow(MAP)
        for _ in range(200):  # the fence is recorded alone: the target has not acknowledged seqno 3
            record = (await store.records())[0].handover
            if record.fenced_at is not None:
                break
            await asyncio.sleep(0.02)
        assert (record.fenced_at, record.acked) == (3, None)
        assert (await maps.load(3))[0].revision == 1
        held["b"] = 3
        for fn in listeners:
            fn(0)
        await node.fenced()
        record = (await store.records())[0].handover
        assert (record.fenced_at, record.acked) == (3, 3)
        switched, _ = await maps.load(3)
        assert switched.revision == 2 and switched.placements[0] == Placement("b", ("a",))


async def test_the_fence_waits_briefly_for_the_target_to_come_within_a_handful_of_items(
        client: EtcdClient, tmp_path: Path) -> None:
    """Within ``catch_up_items`` the fence may start, but it waits up to ``settle_wait_s`` more
    (writes going on) for the target to be within ``settle_items``; then fences anyway."""
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    store, maps = HandoverStore(client, layout), MapStore(client, layout)
    assert await maps.publish(MAP, 0)
    with _engine_of(tmp_path, "a") as engine:
        _three_writes_to_partition_0(engine)
        held = {"b": 1}
        node, listeners = _source_acked_by_b(client, layout, engine, held, catch_up_items=256, settle_items=1,
                                             settle_wait_s=10.0, ack_wait_s=5.0)
        await client.put(store.record_key(0), json.dumps(Handover(0, "a", "b").to_json()).encode())
        await node.load()
        await node.follow(MAP)
        await asyncio.sleep(0.1)
        assert not engine.writes_stopped(0)  # 2 items behind: within 256, not yet within 1
        held["b"] = 2
        for fn in listeners:
            fn(0)
        for _ in range(200):
            if engine.writes_stopped(0):
                break
            await asyncio.sleep(0.01)
        assert engine.writes_stopped(0)
        held["b"] = 3
        for fn in listeners:
            fn(0)
        await node.fenced()
        assert (await store.records())[0].handover.fenced_at == 3
