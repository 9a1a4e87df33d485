"""A consumer's cluster address: parsing, the single-node fallback (``GET /cluster`` answers 404,
or a named node does not answer), and the per-partition state every node stream shares."""
from __future__ import annotations

import asyncio

import pytest

from clients import Consumer, MemoryStateStore, StreamEnd, UsageError
from clients.cluster import PartitionStates, split_servers
from engine.protocol.client.checkpoint import ConsumerState, PartitionCheckpoint
from engine.protocol.client.offset import StreamOffset
from tests.support.docs import bulk, sets
from tests.support.net import free_port


@pytest.mark.parametrize("server, urls", [
    ("http://a:1", ["http://a:1"]),
    ("http://a:1/,http://b:2", ["http://a:1", "http://b:2"]),
    (" http://a:1 , ,http://b:2,", ["http://a:1", "http://b:2"]),
    (["http://a:1", "http://b:2/"], ["http://a:1", "http://b:2"]),
])
def test_split_servers(server, urls) -> None:
    assert split_servers(server) == urls


@pytest.mark.parametrize("server", [",", ["http://ok:1", "ftp://bad"], " "])
def test_bad_cluster_addresses_are_usage_errors(server) -> None:
    with pytest.raises(UsageError):
        Consumer(server)


async def test_state_views_write_only_their_partitions_and_coalesce_writes() -> None:
    store = MemoryStateStore()
    loaded = ConsumerState({0: PartitionCheckpoint(StreamOffset.at(1, 5)), 1: PartitionCheckpoint(StreamOffset.at(1, 7))},
                           "old-node", 2)
    states = PartitionStates(store, loaded, interval=0.2)
    a, b = states.view([0]), states.view([1])
    assert a.load() == ConsumerState({0: loaded.partitions[0]}, None, 2)
    # a view's session also reports partitions it does not own (saved, not streamed): ignored
    a.save(ConsumerState({0: PartitionCheckpoint(StreamOffset.at(1, 9)), 1: PartitionCheckpoint(StreamOffset.at(1, 0))}))
    assert store.load().partitions[0].offset.seqno == 9 and store.load().partitions[1].offset.seqno == 7
    assert store.load().node_id is None  # positions do not depend on the node
    b.save(ConsumerState({1: PartitionCheckpoint(StreamOffset.at(1, 8))}))
    assert store.load().partitions[1].offset.seqno == 7  # coalesced: written within the interval
    await asyncio.sleep(0.4)
    assert store.load().partitions[1].offset.seqno == 8


@pytest.mark.slow
async def test_a_single_node_after_an_unreachable_one_is_streamed_as_today(upr_server) -> None:
    server = upr_server(partitions=4)
    bulk(server.url, sets("k", 40))
    dead = f"http://127.0.0.1:{free_port()}"
    consumer = Consumer([dead, server.url], start="beginning", until_now=True, open_timeout=5)
    events = []
    async with consumer:
        async for ev in consumer:
            events.append(ev)
    assert consumer._cluster is None and consumer.server == server.url  # 404: not a cluster
    assert len({e.key for e in events if hasattr(e, "key")}) == 40
    assert sorted(e.partition for e in events if type(e) is StreamEnd) == [0, 1, 2, 3]
