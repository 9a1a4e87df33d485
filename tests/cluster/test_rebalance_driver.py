"""Rebalance's adapters against a real etcd: a request is stored once (a second waits its turn),
the driver plans it, builds copies, starts takeover records graceful failover's driver leaves
alone, winds a stopped run down and records the outcome.  The data plane is covered end to end
in test_rebalance_e2e."""
from __future__ import annotations

import uuid

import pytest

from app.cluster.election import Election
from app.cluster.etcd import EtcdClient, EtcdError
from app.cluster.handover import HandoverDriver, HandoverStore
from app.cluster.layout import Layout
from app.cluster.mapstore import MapStore
from app.cluster.rebalance import RebalanceDriver, RebalanceStore
from engine.cluster.orchestration import ClusterView
from engine.cluster.partition_map import PartitionMap, Placement
from engine.cluster.promotion import ReplicaProgress
from engine.cluster.rebalance import REBALANCE, RebalanceRequest
from tests.cluster.etcd_server import EtcdProcess

MAP = PartitionMap(1, (Placement("a", ("b",)), Placement("b", ("a",)), Placement("a", ("b",)),
                       Placement("b", ("a",))))
LIVE = frozenset({"a", "b", "c"})


@pytest.fixture
async def client(etcd: EtcdProcess):
    c = EtcdClient([etcd.url])
    yield c
    await c.aclose()


def synced(current: PartitionMap) -> dict[tuple[int, str], ReplicaProgress]:
    return {(p, r): ReplicaProgress(10, True) for p, pl in enumerate(current.placements) for r in pl.replicas}



async def _orchestrating(client: EtcdClient) -> tuple[Layout, MapStore, Election]:
    """A fresh cluster prefix whose map is ``MAP``, with node "a" elected orchestrator."""
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    lease, _ttl = await client.grant(30)
    election = Election(client, layout, "a", lease)
    await election.campaign()
    maps = MapStore(client, layout)
    assert await maps.publish(MAP, 0)
    return layout, maps, election

async def test_the_driver_plans_builds_hands_over_and_winds_a_stopped_run_down(client: EtcdClient) -> None:
    layout, maps, election = await _orchestrating(client)
    notes: list[tuple[str, dict]] = []
    driver = RebalanceDriver(client, layout, maps, election.guard,
                             note=lambda message, **fields: notes.append((message, fields)))
    failover = HandoverDriver(client, layout, maps, election.guard)
    store = RebalanceStore(client, layout)

    async def cycle(progress=None) -> PartitionMap:
        current, mod = await maps.load(4)
        view = ClusterView(current, LIVE, 1, synced(current) if progress is None else progress)
        step, observed = await driver.observe(view)
        await failover.cycle(view, mod)  # leaves the rebalance's records alone
        await driver.carry_out(step, observed, view, mod)
        return (await maps.load(4))[0]

    assert await store.ask(RebalanceRequest(id="r1"), add=("c",))
    assert not await store.ask(RebalanceRequest(id="r2"))  # one run at a time
    await cycle()
    planned = (await store.observe()).request
    assert planned is not None and planned.planned and planned.total > 0 and planned.origin == MAP.placements

    built = await cycle()  # the new copies on c, as replicas
    assert "c" in built.nodes() and all(p.active in ("a", "b") for p in built.placements)
    catching_up = {**synced(built), **{(p, "c"): ReplicaProgress(1, False) for p in range(4)}}
    assert await cycle(catching_up) == built  # no takeover before the copy is in sync

    await cycle()  # in sync: a takeover record for each partition whose active moves to c
    records = (await store.observe()).records
    assert records and all(s.handover.kind == REBALANCE and s.handover.target == "c" for s in records.values())
    assert (await HandoverStore(client, layout).records()).keys() == records.keys()

    stopped = await store.stop()
    assert stopped is not None and stopped.stopped
    await cycle()  # the takeovers are called off, the copies built are dropped
    assert not (await store.observe()).records
    final = await cycle()
    for _ in range(3):
        if (await store.observe()).request is None:
            break
        final = await cycle()
    assert (await store.observe()).request is None
    moved = [p for p in range(4) if final.placements[p] != MAP.placements[p]]
    assert all(final.placements[p] == planned.target[p] for p in moved)  # finished, or never started
    assert final.placements[1] == MAP.placements[1]  # its takeover was called off, its copy on c dropped
    last = await store.last()
    assert last is not None and last["id"] == "r1" and last["result"] == "stopped" and last["moved"] == len(moved)
    # the node's event log (the console's timeline) saw the plan, each takeover and the outcome
    assert notes[0][0].startswith("rebalance planned") and notes[-1][0].startswith("rebalance stopped")
    assert {f["partition"] for m, f in notes if m.startswith("takeover")} == set(records)


async def test_auto_rebalance_starts_a_run_for_a_node_that_joined_holding_nothing(client: EtcdClient) -> None:
    layout, maps, election = await _orchestrating(client)
    driver = RebalanceDriver(client, layout, maps, election.guard)
    view = ClusterView(MAP, frozenset({"a", "b"}), 1, synced(MAP))
    await driver.start_for_joined(view, await driver.store.observe())
    assert (await driver.store.observe()).request is None  # every live node holds copies
    view = ClusterView(MAP, LIVE, 1, synced(MAP))
    await driver.start_for_joined(view, await driver.store.observe())
    request = (await driver.store.observe()).request
    assert request is not None and request.id.startswith("auto-") and not request.eject


async def test_with_a_watch_the_drivers_read_the_moves_only_once_marked_changed(client: EtcdClient) -> None:
    layout, maps, election = await _orchestrating(client)
    driver = RebalanceDriver(client, layout, maps, election.guard)
    store = RebalanceStore(client, layout)
    view = ClusterView(MAP, LIVE, 1, synced(MAP))
    driver.watched = True  # the orchestrator's watch marks ``dirty`` from here on
    _step, observed = await driver.observe(view)
    assert observed.request is None
    assert await store.ask(RebalanceRequest(id="r1"))
    _step, observed = await driver.observe(view)
    assert observed.request is None  # unmarked: the idle cycle read nothing
    driver.dirty = True
    _step, observed = await driver.observe(view)
    assert observed.request is not None and observed.request.id == "r1"
    driver.watched = False  # no watch: every cycle reads
    await store.stop()
    _step, observed = await driver.observe(view)
    assert observed.request is not None and observed.request.stopped


async def test_a_failed_read_leaves_the_drivers_marked_changed(client: EtcdClient) -> None:
    """A read that fails (etcd slow or away) is made again next cycle: the change the watch
    marked would otherwise wait for another change under the moves' keys (a handover's fence
    never switched, its partition's writes paused)."""
    layout, maps, election = await _orchestrating(client)
    rebalance = RebalanceDriver(client, layout, maps, election.guard)
    handover = HandoverDriver(client, layout, maps, election.guard)
    for driver in (rebalance, handover):
        driver.watched = True
        await driver.read()  # the first read, then idle
        assert not driver.dirty
    store = RebalanceStore(client, layout)
    assert await store.ask(RebalanceRequest(id="r1"))
    records = HandoverStore(client, layout)
    await client.put(records.record_key(0), b'{"partition": 0, "source": "a", "target": "b"}')

    async def unavailable() -> None:
        raise EtcdError("etcd did not answer")

    for driver, reader in ((rebalance, "observe"), (handover, "records")):
        driver.dirty = True  # the watch saw the change
        real = getattr(driver.store, reader)
        setattr(driver.store, reader, unavailable)
        with pytest.raises(EtcdError):
            await driver.read()
        setattr(driver.store, reader, real)
        assert driver.dirty
    _step, observed = await rebalance.observe(ClusterView(MAP, LIVE, 1, synced(MAP)))
    assert observed.request is not None and observed.request.id == "r1"
    await handover.read()
    assert handover._read is not None and 0 in handover._read[1]
