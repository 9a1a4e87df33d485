"""Clients over a cluster: a real etcd, three real nodes (8 partitions, 1 replica) for the module.

The consumer's API on a cluster: ``seek`` restarts one partition on its node; a barrier requested
while a partition is between a rollback answer and its new request still covers that partition.

The backup client follows the partition map.
A full backup, then an incremental one during which a node is SIGKILLed (from inside the run,
at its first progress report, so the kill lands while partitions stream): the run finishes
anyway, each of the dead node's partitions resumed on its new active from its saved position,
and the archive verifies.  The cluster is then emptied and restored through ``upr backup restore
--server`` naming the dead node first (any node will do): every key equals the source's state at
the backup, each partition's writes sent to its active node."""
from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clients import BarrierReached, Consumer, Mutation, Rollback, StreamOffset
from clients.backup import Archive, create_backup, restore, verify
from clients.backup.restore import BulkClient
from clients.backup.targets import PartitionTargets
from clients.cluster import ClusterStreams
from clients.consumer import NodeStream
from clients.errors import ConnectionFailed
from engine.protocol.client.routing import MapView
from tests.backup.live import cli
from tests.cluster.etcd_server import start_etcd
from tests.cluster.nodes import Cluster, partition_of, placed, replicas_caught_up, started_in_sync, until

pytestmark = pytest.mark.slow

restore_module = importlib.import_module("clients.backup.restore")  # the package exports a function of that name

PARTS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One etcd and three nodes for the module (the last test kills one of them)."""
    etcd = start_etcd(tmp_path_factory.mktemp("etcd"))
    # a dead node's replica slots move on after 1 s: a restore ends each partition with a
    # persist_majority wait, which two live copies of the partition must answer
    nodes = Cluster(tmp_path_factory.mktemp("nodes"), etcd.url, partitions=PARTS, replicas=1, initial_nodes=3,
                    prefix=f"/upr/{uuid.uuid4().hex[:8]}", extra_args=["--replica-replace-after-s", "1"])
    try:
        started_in_sync(nodes, ["n1", "n2", "n3"])
        yield nodes
    finally:
        nodes.stop_all()
        etcd.stop()


def actives(view: dict[str, Any]) -> dict[int, str]:
    urls = {n["name"]: n["url"] for n in view["nodes"] if n["url"] and n["state"] == "up"}
    return {e["partition"]: urls[e["active"]] for e in view["map"]["partitions"]}


def write(view: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """Each op to its partition's active node (``memory``; the test waits for the replicas itself)."""
    where = actives(view)
    by_url: dict[str, list[dict[str, Any]]] = {}
    for op in ops:
        by_url.setdefault(where[partition_of(op["key"], PARTS)], []).append(op)
    with httpx.Client(timeout=60) as client:
        for url, batch in by_url.items():
            for i in range(0, len(batch), 1000):
                r = client.post(f"{url}/docs/_bulk", params={"durability": "memory"}, json=batch[i:i + 1000])
                assert r.status_code == 200, r.text[:300]
                bad = [x for x in r.json()["results"] if x["status"] not in (200, 404)]
                assert not bad, bad[:3]


def state(view: dict[str, Any], keys: list[str]) -> dict[str, bytes | None]:
    """Every key's value (None: absent) read from its partition's active node."""
    where = actives(view)
    out: dict[str, bytes | None] = {}
    with httpx.Client(timeout=30) as client:
        for key in keys:
            r = client.get(f"{where[partition_of(key, PARTS)]}/docs/{key}")
            assert r.status_code in (200, 404), (key, r.status_code, r.text)
            out[key] = r.content if r.status_code == 200 else None
    return out


def test_seek_and_positions_on_a_cluster_consumer(cluster: Cluster) -> None:
    """``seek`` of a streaming partition restarts it on its node (the other nodes' partitions are
    not handed over again); ``position``, ``failover_log`` and ``partition_info`` answer from the
    partition's node."""
    view = cluster.view("n1")
    keys = [f"seek-{i}" for i in range(PARTS * 20)]
    write(view, [{"op": "set", "key": k, "value": f"s-{k}"} for k in keys])
    per_part: dict[int, int] = {}
    for k in keys:
        per_part[partition_of(k, PARTS)] = per_part.get(partition_of(k, PARTS), 0) + 1
    asyncio.run(_seek(cluster, view, per_part))


async def _seek(cluster: Cluster, view: dict[str, Any], per_part: dict[int, int]) -> None:
    urls = [cluster.nodes[n].url for n in ("n1", "n2", "n3")]
    target = next(e["partition"] for e in view["map"]["partitions"] if e["active"] == "n2")
    seen: dict[int, list[int]] = {p: [] for p in range(PARTS)}
    consumer = Consumer(urls, name="seeker", start="beginning")
    sought = False
    first_pass: list[int] = []
    high = StreamOffset()
    try:
        async def consume() -> None:
            nonlocal sought, high
            async for event in consumer:
                if type(event) is not Mutation or not event.key.startswith("seek-"):
                    continue
                seen[event.partition].append(event.seqno)
                if not sought and all(len(seen[p]) >= per_part[p] for p in range(PARTS)):
                    assert consumer._cluster is not None
                    high = consumer.position(target)
                    assert high.seqno >= per_part[target] and consumer.failover_log(target)
                    info = await consumer.partition_info(target)
                    assert info["partition"] == target and int(info["high_seqno"]) >= high.seqno
                    first_pass.extend(seen[target])
                    for p in seen:
                        seen[p] = []
                    consumer.seek(target, StreamOffset())  # from the beginning again
                    sought = True
                elif sought and len(seen[target]) >= per_part[target]:
                    return

        await asyncio.wait_for(consume(), 60)
        assert seen[target][:len(first_pass)] == first_pass  # the same items, from the beginning
        assert not any(seen[p] for p in seen if p != target), "a seek must not replay other partitions"
    finally:
        await consumer.close()

    # before the first iteration (the map is read, no node stream open yet): the start offset
    later = Consumer(urls, name="seeker-2", start="beginning", until_now=True)
    try:
        await later.connect()
        assert later._cluster is not None
        middle = first_pass[len(first_pass) // 2]
        later.seek(target, StreamOffset.at(high.uuid, middle))
        got = [e.seqno async for e in later if type(e) is Mutation and e.partition == target]
        assert got and min(got) > middle and max(got) >= first_pass[-1], (middle, got)
    finally:
        await later.close()


def test_a_cluster_barrier_covers_a_partition_that_is_rolling_back(cluster: Cluster) -> None:
    """The barrier is requested while the application handles a ``Rollback`` (``on_rollback=
    "report"``: the partition's new request waits for the handler), right after a write to that
    partition was acknowledged: the merged cut must name the partition and cover the write."""
    view = cluster.view("n1")
    target = next(e["partition"] for e in view["map"]["partitions"] if e["active"] == "n2")
    keys = [k for k in (f"rb-{i}" for i in range(400)) if partition_of(k, PARTS) == target][:6]
    write(view, [{"op": "set", "key": k, "value": "before"} for k in keys[:5]])
    asyncio.run(_barrier_during_rollback(cluster, view, target, keys[5]))


async def _barrier_during_rollback(cluster: Cluster, view: dict[str, Any], target: int, key: str) -> None:
    urls = [cluster.nodes[n].url for n in ("n1", "n2", "n3")]
    active = actives(view)[target]
    # a position on a branch the cluster never had: the partition's request is answered with a rollback
    consumer = Consumer(urls, name="barrier-rollback", start="beginning", on_rollback="report",
                        offsets={target: StreamOffset.at(12345, 3)})
    cookie = None
    acked = 0
    delivered: dict[int, float] = {}
    try:
        async def consume() -> Any:
            nonlocal cookie, acked
            async for event in consumer:
                if type(event) is Rollback and event.partition == target and cookie is None:
                    async with httpx.AsyncClient() as client:
                        r = await client.put(f"{active}/docs/{key}", content=b"acked", timeout=30)
                    assert r.status_code == 200, r.text
                    acked = int(r.json()["seqno"])
                    cookie = consumer.request_barrier()  # the partition is not streaming now
                    await asyncio.sleep(0.3)  # a handler that takes its time: a cookie sent now reaches the node first
                elif type(event) is Mutation and event.partition == target:
                    delivered[event.seqno] = 1
                elif type(event) is BarrierReached and event.cookie == cookie:
                    return event

        reached = await asyncio.wait_for(consume(), 60)
        assert set(reached.seqnos) == set(range(PARTS)), reached.seqnos
        assert reached.seqnos[target] >= acked and acked in delivered, (reached.seqnos, acked, sorted(delivered))
    finally:
        await consumer.close()


def test_restore_writes_follow_the_map_past_a_stale_target(cluster: Cluster) -> None:
    """A restore worker holding a stale map sends a partition's batch to a node that is not its
    active: the items come back 421, the map is read again and the batch goes to the active."""
    view = cluster.view("n1")
    urls = [cluster.nodes[n].url for n in ("n1", "n2", "n3")]
    target = next(e["partition"] for e in view["map"]["partitions"] if e["active"] == "n3")
    key = next(k for k in (f"stale-{i}" for i in range(400)) if partition_of(k, PARTS) == target)
    targets = PartitionTargets(",".join(urls), None)
    assert targets.cluster and targets.urls is not None and targets.url_of(target) == cluster.nodes["n3"].url
    targets.urls[target] = cluster.nodes["n1"].url  # as if the partition had moved since the map was read
    client = BulkClient(",".join(urls), targets=targets)
    try:
        [result] = client.write([{"op": "set", "key": key, "value": "restored"}], persist=True, partition=target)
    finally:
        client.close()
    assert result["status"] == 200 and result["partition"] == target
    assert targets.url_of(target) == cluster.nodes["n3"].url
    stored = httpx.get(f"{cluster.nodes['n3'].url}/docs/{key}", timeout=10).content
    assert stored == b'"restored"'  # a JSON value is kept as its text


def test_backup_and_restore_follow_the_map_through_a_sigkill(tmp_path: Path, cluster: Cluster,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    view = cluster.view("n1")
    urls = [cluster.nodes[n].url for n in ("n1", "n2", "n3")]
    keys = [f"doc-{i}" for i in range(1500)]
    write(view, [{"op": "set", "key": k, "value": f"v1-{k}-" + "x" * 200} for k in keys])
    until(lambda: replicas_caught_up(cluster), what="every replica in sync")

    archive_dir = tmp_path / "archive"
    r = cli("create", "--archive", str(archive_dir), "--server", ",".join(urls), "--json", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["partitions_taken"] == PARTS

    # changes for the incremental run: updates, deletions, new keys
    more = [f"new-{i}" for i in range(1000)]
    write(view, [{"op": "set", "key": k, "value": f"v2-{k}-" + "y" * 1000} for k in keys[:750]]
          + [{"op": "delete", "key": k} for k in keys[1250:]]
          + [{"op": "set", "key": k, "value": os.urandom(500).hex()} for k in more])
    until(lambda: replicas_caught_up(cluster), what="every replica in sync")
    victim = "n1"
    owned = sorted(p for p, a in ((e["partition"], e["active"]) for e in view["map"]["partitions"]) if a == victim)
    assert owned
    killed: list[tuple[int, int]] = []

    def kill_mid_run(done: int, total: int) -> None:
        if not killed:
            killed.append((done, total))
            cluster.nodes[victim].kill()

    with caplog.at_level(logging.INFO, logger="upr.client"):
        # a small flow-control window: the killed node cannot have sent its partitions ahead
        result = create_backup(archive_dir, urls, idle_timeout=60, progress=kill_mid_run, name="cluster-backup",
                               window_bytes=64 << 10)
    assert killed and killed[0][0] < killed[0][1], killed  # the kill landed inside the run
    assert result.partitions_taken == PARTS and not result.resumed
    lost = [rec for rec in caplog.records if f"node {victim}" in rec.getMessage()
            and ("lost" in rec.getMessage() or "left" in rec.getMessage())]
    assert lost, "the run never lost its stream of the killed node"
    archive = Archive.open(archive_dir)
    assert len(archive.runs()) == 2 and verify(archive).ok
    print(f"\nincremental run: {result.mutations} mutations, {result.deletions} deletions, "
          f"{result.seconds:.2f}s; killed {victim} (active for {owned}) at {killed[0][0]}/{killed[0][1]} items")

    survivor = "n2"
    after = until(lambda: (lambda v: v if all(e["active"] not in (None, victim) for e in v["map"]["partitions"])
                           else None)(cluster.view(survivor)), what="the failover of n1's partitions")
    everything = keys + more
    source = state(after, everything)
    assert sum(v is not None for v in source.values()) == 1250 + 1000

    # empty the cluster, then restore it; the dead node's URL first: any node will do
    write(after, [{"op": "delete", "key": k} for k in everything])
    assert set(state(after, everything[::50]).values()) == {None}
    live = [cluster.nodes[n].url for n in ("n2", "n3")]
    r = cli("restore", "--archive", str(archive_dir), "--server", ",".join([urls[0], *live]), "--json",
            "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["partitions"] == list(range(PARTS)), report
    restored = state(cluster.view(survivor), everything)
    assert restored == source



def test_restore_through_a_sigkill_of_an_active_loses_nothing(tmp_path: Path, cluster: Cluster,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A node is SIGKILLed right after it acknowledged a ``memory`` batch of a partition it is
    active for (restore's fast path): that batch may never have reached the replica that takes
    over.  The partition is written again from its first batch on its new active and ends with a
    ``persist_majority`` batch; the restored cluster equals the archive, key by key."""
    # an earlier test may have killed one: back as an empty member
    cluster.start_all([name for name in ("n1", "n2", "n3") if name not in cluster.live()])
    view = until(lambda: (lambda v: v if all(n["state"] == "up" for n in v["nodes"]) and placed(v)
                          and len(v["nodes"]) == 3 else None)(cluster.view(cluster.live()[0])),
                 what="three live nodes")
    until(lambda: replicas_caught_up(cluster), what="every replica in sync")
    urls = [cluster.nodes[n].url for n in ("n1", "n2", "n3")]
    keys = [f"rk-{i}" for i in range(2400)]
    write(view, [{"op": "set", "key": k, "value": f"r-{k}-" + "z" * 300} for k in keys])
    until(lambda: replicas_caught_up(cluster), what="every replica in sync")
    archive_dir = tmp_path / "archive"
    create_backup(archive_dir, urls, idle_timeout=60, name="restore-kill")
    source = state(view, keys)
    write(view, [{"op": "delete", "key": k} for k in keys])

    actives_by_node = {e["partition"]: e["active"] for e in cluster.view(cluster.live()[0])["map"]["partitions"]}
    target = 1
    victim = actives_by_node[target]
    killed: list[tuple[int, str]] = []
    real_write = restore_module._write

    def write_then_kill(client: BulkClient, p: int, batch: list[Any], durability: str) -> Any:
        ack = real_write(client, p, batch, durability)
        if p == target and durability == "memory" and not killed:
            killed.append((p, ack.route.url))
            cluster.nodes[victim].kill()  # before the partition's next batch: its replica may lack this one
        return ack

    monkeypatch.setattr(restore_module, "_write", write_then_kill)
    report = restore(Archive.open(archive_dir), ",".join(urls), batch_items=50)
    assert killed == [(target, cluster.nodes[victim].url)], killed
    assert report.partitions == list(range(PARTS)) and target in report.rewritten, report
    survivor = next(n for n in ("n1", "n2", "n3") if n != victim)
    after = until(lambda: (lambda v: v if all(e["active"] not in (None, victim) for e in v["map"]["partitions"])
                           else None)(cluster.view(survivor)), what=f"the failover of {victim}'s partitions")
    assert state(after, keys) == source


def test_partition_info_from_a_node_that_does_not_answer_is_a_typed_error() -> None:
    """A backup asks the node a waiting partition streams from for its failover log: a node that
    refuses the connection is the client's ``ConnectionFailed`` naming it, not httpx's own error."""
    asyncio.run(_partition_info_unreachable())


async def _partition_info_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # closed below: nothing listens there
    first = MapView.from_cluster_json({"nodes": [{"name": "n1", "state": "up", "url": dead}],
                                       "map": {"revision": 1, "partitions": [{"partition": 0, "active": "n1"}]}})
    consumer = Consumer([dead], name="info-unreachable", start="beginning")
    async with httpx.AsyncClient() as client:
        streams = ClusterStreams(consumer, [dead], first, dead, client, NodeStream)
        with pytest.raises(ConnectionFailed) as caught:
            await streams.partition_info(0)
    assert caught.value.partition == 0 and dead in str(caught.value)


def test_a_barrier_send_is_held_until_it_is_done() -> None:
    """``request_barrier`` on one node starts the cookie's send as a task: the consumer holds it
    until it is done (the loop keeps only a weak reference, a dropped task can vanish mid-send)."""
    asyncio.run(_barrier_send_held())


async def _barrier_send_held() -> None:
    sent: list[Any] = []
    release = asyncio.Event()

    class SlowConnection:
        async def send_quiet(self, msg: Any) -> None:
            await release.wait()
            sent.append(msg)

    consumer = Consumer("http://127.0.0.1:9", name="held-barrier", start="beginning")
    consumer._conn = SlowConnection()  # type: ignore[assignment]
    cookie = consumer.request_barrier()
    [sending] = consumer._barrier_sends
    assert not sending.done()
    release.set()
    await sending
    assert [m.cookie for m in sent] == [cookie] and not consumer._barrier_sends
    consumer._conn = None
