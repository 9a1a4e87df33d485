"""The control plane against a real etcd: settings fixed at creation, unique live node names,
one orchestrator, revision-guarded maps, failover when a node's lease expires, fencing when a
node's own lease is lost.  Nodes here are in-process; the data plane is not involved."""
import asyncio
import json
import uuid

import pytest

from app.cluster.election import Election
from app.cluster.errors import ClusterMismatch, DuplicateNode
from app.cluster.etcd import EtcdClient
from app.cluster.layout import Layout
from app.cluster.mapstore import MapStore
from app.cluster.membership import ClusterSettings, Membership, join_settings
from app.cluster.orchestrator import Orchestrator
from engine.cluster.partition_map import PartitionMap, Placement
from tests.cluster.etcd_server import EtcdProcess

SETTINGS = ClusterSettings(partitions=8, replicas=1)


@pytest.fixture
async def client(etcd: EtcdProcess):
    c = EtcdClient([etcd.url])
    yield c
    await c.aclose()


@pytest.fixture
def layout() -> Layout:
    return Layout(f"/upr/{uuid.uuid4().hex[:8]}")


async def _until(predicate, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_settings_are_fixed_when_the_cluster_is_created(client: EtcdClient, layout: Layout) -> None:
    assert await join_settings(client, layout, SETTINGS) == SETTINGS
    assert await join_settings(client, layout, SETTINGS) == SETTINGS
    with pytest.raises(ClusterMismatch, match="has 8 partitions and 1 replicas; this node was started with 16 and 1"):
        await join_settings(client, layout, ClusterSettings(16, 1))


async def test_a_live_node_name_cannot_be_taken_twice(client: EtcdClient, layout: Layout) -> None:
    first = Membership(client, layout, "n1", "http://127.0.0.1:1", ttl=5)
    await first.join()
    with pytest.raises(DuplicateNode, match="'n1' is already used by a live node at http://127.0.0.1:1"):
        await Membership(client, layout, "n1", "http://127.0.0.1:2", ttl=5).join()
    await first.leave()
    again = Membership(client, layout, "n1", "http://127.0.0.1:2", ttl=5)
    await again.join()
    await again.leave()


async def test_a_map_is_replaced_only_from_the_revision_it_was_computed_from(client: EtcdClient, layout: Layout) -> None:
    store = MapStore(client, layout)
    empty, mod = await store.load(2)
    assert empty.revision == 0 and mod == 0
    first = empty.succeeded_by([Placement("a"), Placement("b")])
    assert await store.publish(first, mod)
    assert not await store.publish(first.succeeded_by([Placement("b"), Placement("a")]), mod)
    stored, mod2 = await store.load(2)
    assert stored == first and mod2 > mod


async def test_a_paused_orchestrator_that_lost_its_key_cannot_publish(client: EtcdClient, layout: Layout) -> None:
    store = MapStore(client, layout)
    old_lease, _ = await client.grant(30)
    old = Election(client, layout, "old", old_lease)
    await old.campaign()
    current, mod = await store.load(2)
    await client.revoke(old_lease)  # what expiry does while the old orchestrator is paused
    new_lease, _ = await client.grant(30)
    await Election(client, layout, "new", new_lease).campaign()
    stale = current.succeeded_by([Placement("x"), Placement("x")])
    assert not await store.publish(stale, mod, [old.guard()])
    assert (await store.load(2))[0] == current


class Node:
    """A control-plane-only node: membership plus an orchestrator loop, like a server's."""

    # 4 s, not etcd's minimum: three nodes share this one loaded test process, and a 2 s lease
    # expired between a node's grant and the put that joins under it
    def __init__(self, client: EtcdClient, layout: Layout, name: str, ttl: int = 4,
                 replace_after_s: float = 0.0) -> None:
        self.membership = Membership(client, layout, name, f"http://{name}", ttl=ttl)
        self.client, self.layout, self.name = client, layout, name
        self.replace_after_s = replace_after_s
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await join_settings(self.client, self.layout, SETTINGS)
        await self.membership.join()
        election = Election(self.client, self.layout, self.name, self.membership.lease)
        orchestrator = Orchestrator(self.client, self.layout, SETTINGS, election, tick_s=0.2,
                                    replace_after_s=self.replace_after_s)
        self.task = asyncio.create_task(orchestrator.run())

    async def die(self) -> None:
        """Stop keeping the lease alive, as a SIGKILL would: the lease then expires."""
        assert self.membership._keeper is not None and self.task is not None
        self.membership._keeper.cancel()
        self.task.cancel()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        await self.membership.leave()


async def _map(client: EtcdClient, layout: Layout) -> PartitionMap:
    return (await MapStore(client, layout).load(SETTINGS.partitions))[0]


async def _three_nodes_and_a_victim(client: EtcdClient, layout: Layout,
                                    replace_after_s: float) -> tuple[list[Node], Node, PartitionMap]:
    """Three nodes placed, every replica reported in sync, then the busiest node dies."""
    nodes = [Node(client, layout, name, replace_after_s=replace_after_s) for name in ("n1", "n2", "n3")]
    for node in nodes:
        await node.start()

    async def all_placed() -> bool:
        return all(len(p.nodes) == 2 for p in (await _map(client, layout)).placements)

    await _until(all_placed)
    before = await _map(client, layout)
    victim = max(nodes, key=lambda n: (len(before.active_partitions(n.name)), n.name))
    for p, placement in enumerate(before.placements):
        for replica in placement.replicas:
            await client.put(layout.replica_progress(p, replica), json.dumps({"seqno": 10 * p, "in_sync": True}).encode(),
                             lease=next(n for n in nodes if n.name == replica).membership.lease)
    await victim.die()
    return nodes, victim, before


async def test_within_the_grace_a_dead_node_keeps_a_replica_slot_of_everything_it_held(
    client: EtcdClient, layout: Layout
) -> None:
    nodes, victim, before = await _three_nodes_and_a_victim(client, layout, replace_after_s=60.0)

    async def failed_over() -> bool:
        return not (await _map(client, layout)).active_partitions(victim.name)

    await _until(failed_over)
    await asyncio.sleep(1.0)  # a few more orchestrator cycles: still nothing placed elsewhere
    after = await _map(client, layout)
    for old, new in zip(before.placements, after.placements):
        if old.active == victim.name:
            assert new.active in old.replicas and new.replicas == (victim.name,)
        else:
            assert new == old
    for node in nodes:
        if node is not victim:
            await node.stop()


async def test_three_nodes_get_a_balanced_map_and_a_dead_node_s_partitions_move_to_in_sync_replicas(
    client: EtcdClient, layout: Layout
) -> None:
    # no grace: the dead node's slots are filled on the live nodes at once; the victim is the node
    # active for most partitions, often the orchestrator too, whose role must move first
    nodes, victim, before = await _three_nodes_and_a_victim(client, layout, replace_after_s=0.0)

    async def failed_over() -> bool:
        return victim.name not in (await _map(client, layout)).nodes()

    await _until(failed_over)
    after = await _map(client, layout)
    assert after.revision > before.revision
    for p, (old, new) in enumerate(zip(before.placements, after.placements)):
        if old.active == victim.name:
            assert new.active in old.replicas  # promoted, never an empty new copy
        else:
            assert new.active == old.active
        assert len(new.nodes) == 2
    for node in nodes:
        if node is not victim:
            await node.stop()


async def test_the_orchestrator_role_moves_when_its_node_dies(client: EtcdClient, layout: Layout) -> None:
    nodes = [Node(client, layout, name) for name in ("n1", "n2")]
    for node in nodes:
        await node.start()

    async def elected() -> bool:
        return await client.get(layout.orchestrator) is not None

    await _until(elected)
    holder = (await client.get(layout.orchestrator)).value.decode()  # type: ignore[union-attr]
    first = next(n for n in nodes if n.name == holder)
    await first.die()

    async def moved() -> bool:
        kv = await client.get(layout.orchestrator)
        return kv is not None and kv.value.decode() != holder

    await _until(moved)
    for node in nodes:
        if node is not first:
            await node.stop()


async def test_a_node_that_loses_its_lease_is_told_to_stop_serving(client: EtcdClient, layout: Layout) -> None:
    lost = asyncio.Event()
    member = Membership(client, layout, "n1", "http://n1", ttl=1, on_lost=lost.set)
    await member.join()
    await client.revoke(member.lease)  # as expiry during a long pause would
    await asyncio.wait_for(lost.wait(), 10)
    assert member.lost
    await member.leave()


async def test_a_failover_decided_on_a_node_s_absence_is_not_published_once_it_rejoined(
    client: EtcdClient, layout: Layout
) -> None:
    # x is active for partition 0 and gone; b holds an in-sync replica: the step promotes b
    await join_settings(client, layout, SETTINGS)
    store = MapStore(client, layout)
    placements = [Placement("x", ("b",))] + [Placement("b") for _ in range(SETTINGS.partitions - 1)]
    assert await store.publish(PartitionMap.empty(SETTINGS.partitions).succeeded_by(placements), 0)
    b = Membership(client, layout, "b", "http://b", ttl=5)
    await b.join()
    await client.put(layout.replica_progress(0, "b"), json.dumps({"seqno": 7, "in_sync": True}).encode(),
                     lease=b.lease)
    election = Election(client, layout, "b", b.lease)
    await election.campaign()
    orchestrator = Orchestrator(client, layout, SETTINGS, election, replace_after_s=60.0)
    view, mod = await orchestrator.observe()
    assert "x" not in view.live_nodes
    x = Membership(client, layout, "x", "http://x", ttl=5)
    await x.join()  # x rejoins after the observation and before the publish: it may read map 1 now
    decision = await orchestrator.act(view, mod)
    assert decision.new_map is None  # not published
    assert (await _map(client, layout)).revision == 1
    again = await orchestrator.cycle()  # observed afresh: x is live, nothing to fail over
    assert again.promotions == () and (await _map(client, layout)).placements[0].active == "x"
    await x.leave()
    await b.leave()
