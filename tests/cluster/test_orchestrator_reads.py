"""The orchestrator behind a node's watch reads etcd only when something may have changed: an
idle cluster's ticks cost no etcd request, a watched change costs one reading, and what the
orchestrator wrote itself is read back on the next cycle.  Real etcd; the watch is played by
hand through the ``ProgressView`` the node's watch feeds."""
import uuid

import pytest

from app.cluster.election import Election
from app.cluster.etcd import EtcdClient
from app.cluster.layout import Layout
from app.cluster.mapstore import MapStore
from app.cluster.membership import ClusterSettings, Membership, join_settings
from app.cluster.orchestrator import Orchestrator
from app.cluster.progress_view import ProgressView
from tests.cluster.etcd_server import EtcdProcess

SETTINGS = ClusterSettings(partitions=4, replicas=0)


class CountingClient(EtcdClient):
    """A real client that counts the reads it makes (ranges, by key prefix or key)."""

    reads = 0

    async def _range(self, body):  # type: ignore[no-untyped-def]
        self.reads += 1
        return await super()._range(body)


@pytest.fixture
async def client(etcd: EtcdProcess):
    c = CountingClient([etcd.url])
    yield c
    await c.aclose()


async def _elected(client: CountingClient) -> tuple[Layout, Membership, Election, ProgressView]:
    """A new cluster whose one node "a" won the election, with its watch's first reading taken."""
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    await join_settings(client, layout, SETTINGS)
    node = Membership(client, layout, "a", "http://a", ttl=10)
    await node.join()
    election = Election(client, layout, "a", node.lease)
    await election.campaign()
    view = ProgressView(layout)
    view.reset([], 1)
    return layout, node, election, view


async def test_idle_ticks_read_nothing_and_a_watched_change_reads_once(client: CountingClient) -> None:
    layout, node, election, view = await _elected(client)
    orchestrator = Orchestrator(client, layout, SETTINGS, election, progress=view, reread_s=3600)
    try:
        first = await orchestrator.cycle()
        assert first.new_map is not None  # the first map: published, so read back next cycle
        client.reads = 0
        await orchestrator.cycle()
        assert client.reads > 0
        stored, _ = await MapStore(client, layout).load(SETTINGS.partitions)
        assert stored.revision == 1

        client.reads = 0
        for _ in range(5):
            assert (await orchestrator.cycle()).new_map is None
        assert client.reads == 0  # idle ticks: a step on what is known

        view.saw()  # a node joined, left, or the map changed: nodes and map are read again
        await orchestrator.cycle()
        node_and_map = client.reads
        assert node_and_map == 2
        client.reads = 0
        await orchestrator.cycle()
        assert client.reads == 0

        view.saw(move=True)  # a handover or rebalance key: their drivers read as well
        await orchestrator.cycle()
        assert client.reads > node_and_map

        client.reads = 0
        view.lost()  # the watch ended: every cycle reads until the next reading
        await orchestrator.cycle()
        await orchestrator.cycle()
        assert client.reads >= 2 * 3  # nodes, map and progress, each cycle
    finally:
        await node.leave()


async def test_the_safety_reread_bounds_how_long_a_reading_is_trusted(client: CountingClient) -> None:
    layout, node, election, view = await _elected(client)
    now = [0.0]
    orchestrator = Orchestrator(client, layout, SETTINGS, election, progress=view, reread_s=5.0,
                                clock=lambda: now[0])
    try:
        await orchestrator.cycle()
        await orchestrator.cycle()
        client.reads = 0
        now[0] = 4.0
        await orchestrator.cycle()
        assert client.reads == 0
        now[0] = 10.0
        await orchestrator.cycle()
        assert client.reads == 2
    finally:
        await node.leave()
