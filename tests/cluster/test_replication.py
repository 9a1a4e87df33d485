"""Replication streams against a real active ``upr server`` and a real etcd: the replica copy,
fed over the normal stream protocol, ends with the active's by-seqno history item for item
(seqno, CAS, rev, deletions), reports its progress under its lease, shows as replication in
``GET /streams``, and resyncs from 0 when its history is not the active's."""
from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path

import httpx
import pytest

from app.cluster.etcd import EtcdClient
from app.cluster.layout import Layout
from app.cluster.replication import ReplicationStreams
from engine.config import EngineConfig
from engine.core.types import Op, PartitionState, WriteOp
from engine.engine import Engine
from tests.cluster.etcd_server import EtcdProcess
from tests.support.docs import bulk, sets
from tests.support.server import start_server

PARTS = 4


def history(data_dir: Path, partitions: int = PARTS) -> tuple[dict[int, list[tuple]], dict[int, int]]:
    """Every partition's by-seqno scan (key, seqno, cas, rev, deleted, value) and high seqno."""
    scans, highs = {}, {}
    with Engine.open(EngineConfig(data_dir=data_dir, partitions=partitions)) as engine:
        for p in range(partitions):
            highs[p] = engine.high_seqno(p)
            with engine.snapshot(p, 0) as snap:
                scans[p] = [tuple(item) for item in snap.items()]
    return scans, highs


async def until(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, f"{what} not reached in {timeout:.0f}s"
        await asyncio.sleep(0.05)


def replica_engine(data_dir: Path) -> Engine:
    engine = Engine.open(EngineConfig(data_dir=data_dir, partitions=PARTS, flush_interval_ms=2.0))
    for p in range(PARTS):
        engine.set_state(p, PartitionState.REPLICA)
    return engine


async def replicate_and_compare(tmp_path: Path, etcd: EtcdProcess, replica_dir: Path,
                                engine: Engine | None = None) -> ReplicationStreams:
    active = start_server(tmp_path / "active", partitions=PARTS)
    etcd_client = EtcdClient([etcd.url])
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    engine = engine or replica_engine(replica_dir)
    streams = None
    try:
        bulk(active.url, sets("a", 300), "persist")
        bulk(active.url, sets("a", 100, tag="w"))  # rewrites: the active deduplicates
        bulk(active.url, [{"op": "delete", "key": f"a{i}"} for i in range(100, 150)])
        lease, _ttl = await etcd_client.grant(10)
        streams = ReplicationStreams(engine, "r1", etcd_client, layout, lambda: lease, publish_interval_s=0.05)
        streams.update({p: ("a1", active.url) for p in range(PARTS)})
        bulk(active.url, sets("b", 200))  # live writes while the replica catches up

        async def replica_streams() -> bool:
            async with httpx.AsyncClient() as http:
                listed = (await http.get(f"{active.url}/streams")).json()["streams"]
            return any(s["name"] == "replication:r1" and s.get("kind") == "replication" for s in listed)

        await until(replica_streams, what="a replication stream in GET /streams")
        highs = {p: httpx.get(f"{active.url}/partitions/{p}").json()["high_seqno"] for p in range(PARTS)}

        async def caught_up() -> bool:
            kvs, _ = await etcd_client.get_prefix(layout.progress)
            got = {layout.progress_owner(kv.key): (json.loads(kv.value), kv.lease) for kv in kvs}
            return all(got.get((p, "r1")) == ({"seqno": highs[p], "in_sync": True}, lease) for p in range(PARTS))

        await until(caught_up, what="every replica in sync at the active's high seqno")
        await streams.aclose()
        engine.close()
        assert active.stop() in (0, -signal.SIGTERM)  # uvicorn ends a clean stop by re-raising SIGTERM
        expected = history(active.data_dir)
        assert sum(map(len, expected[0].values())) == 500  # 300 a (50 of them deleted) + 200 b
        assert history(replica_dir) == expected
    finally:
        if streams is not None:
            await streams.aclose()
        engine.close()
        active.kill()
        await etcd_client.aclose()
    return streams


async def test_a_replica_ends_with_the_actives_history(tmp_path: Path, etcd: EtcdProcess) -> None:
    streams = await replicate_and_compare(tmp_path, etcd, tmp_path / "replica")
    assert streams.resets == 0


async def test_a_replica_with_a_foreign_history_resyncs_from_zero(tmp_path: Path, etcd: EtcdProcess) -> None:
    data = tmp_path / "replica"
    engine = Engine.open(EngineConfig(data_dir=data, partitions=PARTS, flush_interval_ms=2.0))
    engine.write_batch([WriteOp(Op.MUTATION, f"mine-{i}", b"x") for i in range(40)])  # its own branch
    engine.flush_now()
    for p in range(PARTS):
        engine.set_state(p, PartitionState.REPLICA)
    streams = await replicate_and_compare(tmp_path, etcd, data, engine)
    assert streams.resets >= 1


async def test_progress_of_more_copies_than_one_transaction_holds_is_published_and_withdrawn(
        tmp_path: Path, etcd: EtcdProcess) -> None:
    """Progress goes out in transactions of at most ``PUBLISH_OPS`` operations: every copy's
    key appears under the lease, and the keys of copies no longer held are withdrawn."""
    from app.cluster.replication import PUBLISH_OPS
    from engine.cluster.replica_sync import ReplicaSync

    client = EtcdClient([etcd.url])
    layout = Layout(f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        lease, _ttl = await client.grant(10)
        streams = ReplicationStreams(None, "r1", client, layout, lambda: lease,  # type: ignore[arg-type]
                                     ack_poll_s=0.01, publish_settle_s=0.0)  # every change at once
        copies = 2 * PUBLISH_OPS + 5
        streams.syncs = {p: ReplicaSync(p) for p in range(copies)}
        await streams.publish_once()
        kvs, _ = await client.get_prefix(layout.progress)
        got = {layout.progress_owner(kv.key): (json.loads(kv.value)["seqno"], kv.lease) for kv in kvs}
        assert got == {(p, "r1"): (p, lease) for p in range(copies)}
        for p in range(PUBLISH_OPS + 3):  # as ``update`` does for copies left behind
            del streams.syncs[p]
            streams._gone.add(p)
        streams.syncs[copies - 1].snapshot_applied(10 * copies)
        await streams.publish_once()
        kvs, _ = await client.get_prefix(layout.progress)
        got = {layout.progress_owner(kv.key): json.loads(kv.value)["seqno"] for kv in kvs}
        assert got == {(p, "r1"): 10 * copies if p == copies - 1 else p for p in range(PUBLISH_OPS + 3, copies)}
        assert not streams._gone
    finally:
        await client.aclose()
