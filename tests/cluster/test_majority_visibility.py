"""``visibility: majority`` on a real two-node cluster: a consumer gets only what a majority of a
partition's copies hold, so a failover can never take back what it delivered.  With the replica
paused (SIGSTOP) the active goes on taking writes; a ``memory`` consumer sees them at once, a
``majority`` consumer sees none of them until the replica holds them again."""
from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import httpx

from clients import Consumer, Mutation
from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster, first_map, partition_of, replicas_caught_up, until

PARTITIONS = 8


class Seen:
    """The keys a consumer delivered, collected by a task that iterates it (cancelling an
    iteration would end the consumer's stream, so the test polls this instead)."""

    def __init__(self, consumer: Consumer) -> None:
        self.keys: set[str] = set()
        self.task = asyncio.create_task(self._read(consumer))

    async def _read(self, consumer: Consumer) -> None:
        async for event in consumer:
            if isinstance(event, Mutation):
                self.keys.add(event.key)

    async def until(self, wanted: set[str], timeout: float = 60) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not wanted <= self.keys:
            assert not self.task.done(), self.task
            assert loop.time() < deadline, f"missing {sorted(wanted - self.keys)}"
            await asyncio.sleep(0.05)


async def test_a_majority_consumer_gets_nothing_a_paused_replica_does_not_hold(
        tmp_path: Path, etcd: EtcdProcess) -> None:
    # a lease far longer than the pause: the paused replica stays in the map
    cluster = Cluster(tmp_path, etcd.url, partitions=PARTITIONS, replicas=1, initial_nodes=2, lease_ttl_s=30,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        cluster.start_all(("n1", "n2"))
        view = first_map(cluster, "n1")
        until(lambda: replicas_caught_up(cluster), what="every replica in sync")
        p = next(e["partition"] for e in view["map"]["partitions"] if e["active"] == "n1")
        keys = [k for k in (f"doc-{i}" for i in range(2000)) if partition_of(k, PARTITIONS) == p]
        before, during = set(keys[:5]), set(keys[5:15])
        n1 = cluster.nodes["n1"]
        for key in sorted(before):
            assert httpx.put(f"{n1.url}/docs/{key}", params={"durability": "majority"}, content=b"b",
                             timeout=60).status_code == 200

        majority = Consumer(n1.url, name="majority", partitions=[p], start="beginning", visibility="majority")
        memory = Consumer(n1.url, name="memory", partitions=[p], start="beginning")
        async with majority, memory:
            seen_majority, seen_memory = Seen(majority), Seen(memory)
            try:
                await seen_majority.until(before)
                cluster.nodes["n2"].proc.send_signal(signal.SIGSTOP)
                try:
                    for key in sorted(during):
                        assert httpx.put(f"{n1.url}/docs/{key}", content=b"d", timeout=60).status_code == 200
                    await seen_memory.until(before | during)
                    await asyncio.sleep(2)  # the memory consumer has them all; give the other time to err
                    assert not seen_majority.keys & during, "delivered what only the active held"
                finally:
                    cluster.nodes["n2"].proc.send_signal(signal.SIGCONT)
                await seen_majority.until(during)
            finally:
                seen_majority.task.cancel()
                seen_memory.task.cancel()
    finally:
        cluster.stop_all()
