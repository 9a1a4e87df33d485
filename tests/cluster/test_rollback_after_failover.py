"""A consumer that saw writes no replica held is told, after the failover, to roll back to exactly
the promotion seqno, and ends identical to the new active (real etcd, three real nodes, 1 replica).

How the replica is made to miss writes: it is paused (SIGSTOP) and the active is given more than
a replication window of data for the partition first, so the active's stream to it stops at the
window (flow control) and the writes that follow are never sent to it; a consumer tailing the
active receives them all and saves its position.  Then the active is SIGKILLed and the replica
resumed: it holds, whole, only the snapshots it had received, so the promotion forks history
below the consumer's position.  The lease TTL is longer than the pause, so the replica stays a
live, in-sync member throughout."""
from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from clients import Consumer, Deletion, Mutation, Rollback
from engine.protocol.client.session import DEFAULT_WINDOW
from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster, first_map, following, partition_of, replicas_caught_up, until
from tests.support.docs import bulk

pytestmark = pytest.mark.slow

PARTS = 8
FILLER_VALUE = 256 << 10


def failover_log(url: str, partition: int) -> list[tuple[int, int]]:
    info = httpx.get(f"{url}/partitions/{partition}", timeout=10).json()
    return [(e["uuid"], e["seqno"]) for e in info["failover_log"]]


def keys_of(partition: int, prefix: str, n: int) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        key = f"{prefix}{i}"
        if partition_of(key, PARTS) == partition:
            out.append(key)
        i += 1
    return out


async def tail_until(consumer: Consumer, docs: dict[str, tuple[int, bytes]], partition: int, high: int,
                     events: list[Any]) -> None:
    """Apply events to ``docs`` (key -> (seqno, value)) until ``partition`` is processed up to ``high``."""
    async for ev in consumer:
        events.append(ev)
        if isinstance(ev, Mutation):
            docs[ev.key] = (ev.seqno, ev.value)
        elif isinstance(ev, Deletion):
            docs.pop(ev.key, None)
        if isinstance(ev, (Mutation, Deletion)) and ev.seqno >= high and not ev.correction:
            await consumer.commit()  # while handling it: the last event counts as processed
            break


async def scan(url: str, partition: int) -> dict[str, tuple[int, bytes]]:
    """The partition's by-seqno scan, as a fresh consumer from 0 to the high seqno sees it."""
    docs: dict[str, tuple[int, bytes]] = {}
    async with Consumer(url, partitions=[partition], start="beginning", until_now=True, ring_size=0) as fresh:
        async for ev in fresh:
            if isinstance(ev, Mutation):
                docs[ev.key] = (ev.seqno, ev.value)
            elif isinstance(ev, Deletion):
                docs.pop(ev.key, None)
    return docs


def test_a_consumer_rolls_back_to_the_promotion_seqno_after_the_active_dies(tmp_path: Path,
                                                                           etcd: EtcdProcess) -> None:
    cluster = Cluster(tmp_path, etcd.url, partitions=PARTS, replicas=1, initial_nodes=3, lease_ttl_s=10,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        cluster.start_all(("n1", "n2", "n3"))
        view = first_map(cluster, "n1")
        entry = next(e for e in view["map"]["partitions"] if e["active"] == "n1")
        p, active, replica = entry["partition"], "n1", entry["replicas"][0]["node"]
        a_url, r_url = cluster.nodes[active].url, cluster.nodes[replica].url
        base = keys_of(p, "base-", 30)
        bulk(a_url, [{"op": "set", "key": k, "value": f"v0-{k}"} for k in base])
        until(lambda: replicas_caught_up(cluster), what="every replica in sync")

        docs: dict[str, tuple[int, bytes]] = {}
        events: list[Any] = []
        state = tmp_path / "consumer"

        async def tail_active(high: int, start: str) -> None:
            async with Consumer(a_url, partitions=[p], start=start, state=state, name="indexer") as consumer:
                await tail_until(consumer, docs, p, high, events)

        asyncio.run(tail_active(httpx.get(f"{a_url}/partitions/{p}").json()["high_seqno"], "beginning"))

        cluster.nodes[replica].proc.send_signal(signal.SIGSTOP)
        try:
            # more than a replication window for the partition, then the writes the replica never gets
            filler = keys_of(p, "filler-", (2 * DEFAULT_WINDOW) // FILLER_VALUE + 4)
            bulk(a_url, [{"op": "set", "key": k, "value": "x" * FILLER_VALUE} for k in filler], chunk=8)
            lost = bulk(a_url, [{"op": "set", "key": k, "value": f"v1-{k}"} for k in base[:10]]
                        + [{"op": "delete", "key": k} for k in base[10:15]])
            high = max(r["seqno"] for r in lost)
            asyncio.run(tail_active(high, "saved"))  # the consumer saw them all and saved its position
            assert docs[base[0]] == (lost[0]["seqno"], f'"v1-{base[0]}"'.encode())
            cluster.nodes[active].kill()
        finally:
            cluster.nodes[replica].proc.send_signal(signal.SIGCONT)

        def promoted() -> dict | None:
            v = cluster.view(replica)
            return v if v["map"]["partitions"][p]["active"] == replica else None

        until(promoted, timeout=90, what=f"partition {p} promoted on {replica}")
        until(lambda: following(cluster, replica), what="the survivors following the new map")
        log = until(lambda: (lg := failover_log(r_url, p)) and len(lg) > 1 and lg, what="the promotion's entry")
        promotion_seqno = log[0][1]
        assert promotion_seqno < high, (promotion_seqno, high)  # the replica really missed writes

        events.clear()

        async def resume() -> dict[str, tuple[int, bytes]]:
            new_high = httpx.get(f"{r_url}/partitions/{p}").json()["high_seqno"]
            corrections_due, rolled_back_to = 0, None
            async with Consumer(r_url, partitions=[p], start="saved", state=state, name="indexer") as consumer:
                async for ev in consumer:
                    events.append(ev)
                    if isinstance(ev, Mutation):
                        docs[ev.key] = (ev.seqno, ev.value)
                    elif isinstance(ev, Deletion):
                        docs.pop(ev.key, None)
                    if isinstance(ev, Rollback):
                        corrections_due, rolled_back_to = ev.corrections, ev.seqno
                    elif isinstance(ev, (Mutation, Deletion)) and ev.correction:
                        corrections_due -= 1
                    # nothing above the rollback point: done once its corrections (which follow it) are in
                    if rolled_back_to is not None and new_high <= rolled_back_to and corrections_due <= 0:
                        break
                    if isinstance(ev, (Mutation, Deletion)) and not ev.correction and ev.seqno >= new_high:
                        break
                await consumer.commit()
            return await scan(r_url, p)

        truth = asyncio.run(resume())
        rollbacks = [ev for ev in events if isinstance(ev, Rollback)]
        assert [(ev.partition, ev.seqno) for ev in rollbacks] == [(p, promotion_seqno)], (rollbacks, high)
        assert sum(ev.corrections for ev in rollbacks) >= 15  # the rewritten and deleted base keys
        assert docs == truth
        assert all(value == f'"v0-{k}"'.encode() for k, (_s, value) in docs.items() if k in base)
    finally:
        cluster.stop_all()
