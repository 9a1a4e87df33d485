"""The cluster end to end: a real etcd and real ``upr server --cluster`` processes on loopback.

Three nodes, 16 partitions, 1 replica, lease TTL 5 s (``tests.cluster.nodes.LEASE_TTL_S``):
``memory`` writes until every replica is in sync, SIGKILL of a node that is active for some
partitions; the map moves them to their replicas, every acknowledged write is on the new actives,
each promoted partition's failover log has exactly one new entry, and the killed node comes back
fenced (it never takes a write for a partition the map no longer gives it: 421 naming the new
active).

Two nodes: the killed node comes back as the replica of every partition and ends with the
active's by-seqno history item for item (its own extra history rolled back)."""
from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import cli
from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import (
    Cluster,
    first_map,
    following,
    partition_of,
    replicas_caught_up,
    started_in_sync,
    until,
    write_routed,
)
from tests.support.wsclient import RawStream

pytestmark = pytest.mark.slow


async def stream_request(url: str, partition: int) -> dict:
    stream = await RawStream.open(url, partitions=[partition], codec="json")
    try:
        await stream.send({"type": "stream_request", "partition": partition, "uuid": 0, "start_seqno": 0,
                           "snap_start": 0, "snap_end": 0})
        return await stream.recv()  # type: ignore[return-value]
    finally:
        await stream.ws.close()


def failover_logs(cluster: Cluster, name: str) -> dict[int, list[tuple[int, int]]]:
    parts = httpx.get(f"{cluster.nodes[name].url}/partitions", timeout=10).json()["partitions"]
    return {p["partition"]: [(e["uuid"], e["seqno"]) for e in p["failover_log"]] for p in parts}


def test_sigkill_of_an_active_node_fails_over_without_losing_in_sync_writes(tmp_path: Path, etcd: EtcdProcess) -> None:
    cluster = Cluster(tmp_path, etcd.url, partitions=16, replicas=1, initial_nodes=3,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        cluster.start_all(("n1", "n2", "n3"))
        view = first_map(cluster, "n1")
        actives = {p["active"] for p in view["map"]["partitions"]}
        assert actives == {"n1", "n2", "n3"}, actives  # a cluster started at once begins balanced
        keys = [f"doc-{i}" for i in range(400)]
        acked = write_routed(cluster, view, keys, "v1")
        acked.update(write_routed(cluster, view, keys[:100], "v2"))  # rewrites
        until(lambda: replicas_caught_up(cluster), what="every replica in sync")

        victim = "n1"
        owned = [p["partition"] for p in view["map"]["partitions"] if p["active"] == victim]
        assert owned
        before = failover_logs(cluster, victim)
        cluster.nodes[victim].kill()

        def failed_over() -> dict | None:
            v = cluster.view("n2")
            moved = all(v["map"]["partitions"][p]["active"] not in (None, victim) for p in owned)
            return v if moved and v["map"]["revision"] > view["map"]["revision"] else None

        after = until(failed_over, timeout=60, what="the failover of the killed node's partitions")
        until(lambda: following(cluster, "n2"), what="the survivors following the new map")
        urls = {n["name"]: n["url"] for n in after["nodes"] if n["url"]}
        for p in owned:
            new_active = after["map"]["partitions"][p]["active"]
            until(lambda: len(failover_logs(cluster, new_active)[p]) > len(before[p]),
                  what=f"partition {p}'s promotion on {new_active}")
            log = failover_logs(cluster, new_active)[p]
            assert len(log) == len(before[p]) + 1, (p, before[p], log)  # exactly one new entry
            assert log[1:] == before[p]
        for key, write in acked.items():
            p = write["partition"]
            node = after["map"]["partitions"][p]["active"]
            r = httpx.get(f"{urls[node]}/docs/{key}", timeout=10)
            assert r.status_code == 200 and r.json() == write["value"], (key, p, node, r.status_code)  # bulk values are JSON

        # the killed node comes back; it never takes writes for what the map gave away
        cluster.start(victim)
        until(lambda: any(n["name"] == victim and n["state"] == "up" for n in cluster.view("n2")["nodes"]),
              what="the restarted node up")
        key = next(k for k in keys if partition_of(k, 16) == owned[0])
        r = httpx.put(f"{cluster.nodes[victim].url}/docs/{key}", content=b"stale", timeout=10)
        assert r.status_code == 421, r.text
        problem = r.json()
        assert problem["type"].endswith("misdirected-request")
        assert problem["url"] == urls[after["map"]["partitions"][owned[0]]["active"]]
        refusal = asyncio.run(stream_request(cluster.nodes[victim].url, owned[0]))
        assert refusal["status"] == "not_my_partition" and "map revision" in refusal["detail"], refusal
    finally:
        cluster.stop_all()


def _two_node_cluster(tmp_path: Path, etcd: EtcdProcess) -> Cluster:
    return Cluster(tmp_path, etcd.url, partitions=8, replicas=1, initial_nodes=2,
                   prefix=f"/upr/{uuid.uuid4().hex[:8]}")


def _two_nodes_in_sync(cluster: Cluster, docs: int) -> tuple[dict[str, Any], list[str]]:
    """n1 and n2 up, ``docs`` documents written through the first map, every replica in sync."""
    keys = [f"doc-{i}" for i in range(docs)]
    return started_in_sync(cluster, ("n1", "n2"), keys), keys


def test_a_killed_node_rejoins_as_replica_and_ends_with_the_actives_history(tmp_path: Path, etcd: EtcdProcess,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    cluster = _two_node_cluster(tmp_path, etcd)
    try:
        _, keys = _two_nodes_in_sync(cluster, docs=200)
        cluster.nodes["n1"].kill()
        until(lambda: all(p["active"] == "n2" for p in cluster.view("n2")["map"]["partitions"]),
              what="every partition active on n2")
        after = cluster.view("n2")
        until(lambda: following(cluster, "n2"), what="n2 following the new map")
        acked = write_routed(cluster, after, keys[:50], "v2")  # history n1 never saw
        cluster.start("n1")
        until(lambda: all(p["replicas"] and p["replicas"][0]["node"] == "n1"
                          for p in cluster.view("n2")["map"]["partitions"]), what="n1 placed as replica")
        until(lambda: replicas_caught_up(cluster), what="n1 in sync again")
        assert acked
        # upr cluster status, asked of the replica's node, shows every lag (taken from the active's node)
        assert cli.main(["cluster", "status", "--server", cluster.nodes["n1"].url, "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["node"] == "n1" and {n["name"]: n["state"] for n in status["nodes"]} == {"n1": "up", "n2": "up"}
        assert all(p["active"] == "n2" and [{k: r[k] for k in ("node", "seqno", "in_sync", "lag")}
                                            for r in p["replicas"]] == [{"node": "n1", "seqno": p["replicas"][0]["seqno"],
                                                                         "in_sync": True, "lag": 0}]
                   for p in status["map"]["partitions"])
        assert cli.main(["cluster", "status", "--server", cluster.nodes["n1"].url]) == 0
        table = capsys.readouterr().out
        assert "map revision" in table and "n1 (" in table and "in sync, lag 0)" in table
        for name in ("n1", "n2"):
            assert cluster.nodes[name].stop() in (0, -15)
        from tests.cluster.test_replication import history

        ours, theirs = history(cluster.nodes["n1"].data_dir, 8), history(cluster.nodes["n2"].data_dir, 8)
        assert sum(map(len, theirs[0].values())) == 200 and ours == theirs
    finally:
        cluster.stop_all()


def test_a_paused_node_that_lost_its_lease_takes_no_more_writes(tmp_path: Path, etcd: EtcdProcess) -> None:
    cluster = _two_node_cluster(tmp_path, etcd)
    try:
        view, keys = _two_nodes_in_sync(cluster, docs=100)
        owned = [p["partition"] for p in view["map"]["partitions"] if p["active"] == "n1"]
        assert owned
        n1 = cluster.nodes["n1"]
        n1.proc.send_signal(signal.SIGSTOP)  # past its lease: the cluster gives its partitions away
        try:
            until(lambda: all(cluster.view("n2")["map"]["partitions"][p]["active"] == "n2" for p in owned),
                  what="n1's partitions failed over to n2")
        finally:
            n1.proc.send_signal(signal.SIGCONT)
        key = next(k for k in keys if partition_of(k, 8) == owned[0])

        def refused() -> bool:
            r = httpx.put(f"{n1.url}/docs/{key}", content=b"stale", timeout=10)
            return r.status_code == 421

        until(refused, what="n1 fenced")
        r = httpx.get(f"{cluster.nodes['n2'].url}/docs/{key}", timeout=10)
        assert r.status_code == 200 and r.json() == f"v1-{key}"
    finally:
        cluster.stop_all()
