"""etcd unavailable for three lease TTLs: killed and started again on the same data dir and port
(a restarted etcd extends every lease), or paused (SIGSTOP) and resumed (every lease expires at
once when it resumes: each node fences its actives, rejoins, and takes them back with their
failover logs as they were, since the map never moved).

Meanwhile every node keeps serving what it owns: each partition's active accepts writes and no
other node does, nobody is failed over or demoted (same map, same failover logs).  When etcd
returns everything recovers without a false failover: the map key's history has no new write,
every node is up once under its name, and the map watch and the orchestrator work again (a node
killed afterwards is failed over as usual)."""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.faults import accepting, assert_one_history, keys_per_partition, map_history
from tests.cluster.nodes import Cluster, replicas_caught_up, started_in_sync, until

pytestmark = pytest.mark.slow

PARTITIONS = 8
TTL_S = 3  # a loaded machine can delay a keep-alive past a 2 s lease
OUTAGE_S = 3.0 * TTL_S


def _partitions(cluster: Cluster, name: str) -> dict[int, tuple[str, list]]:
    parts = httpx.get(f"{cluster.nodes[name].url}/partitions", timeout=10).json()["partitions"]
    return {p["partition"]: (p["state"], p["failover_log"]) for p in parts}


@pytest.mark.parametrize("outage", ["restart", "pause"])
def test_nodes_keep_serving_through_an_etcd_outage_and_recover_without_failover(tmp_path: Path, etcd: EtcdProcess,
                                                                                outage: str) -> None:
    prefix = f"/upr/{uuid.uuid4().hex[:8]}"
    cluster = Cluster(tmp_path, etcd.url, partitions=PARTITIONS, replicas=1, initial_nodes=3, prefix=prefix,
                      lease_ttl_s=TTL_S)
    keys = keys_per_partition(PARTITIONS)
    names = ["n1", "n2", "n3"]
    try:
        view = started_in_sync(cluster, names, [f"doc-{i}" for i in range(100)])
        actives = {p["partition"]: p["active"] for p in view["map"]["partitions"]}
        before = {n: _partitions(cluster, n) for n in names}
        history_before = map_history(etcd.url, prefix, idle_s=0.5)

        etcd.stop() if outage == "restart" else etcd.pause()
        down_at = time.monotonic()
        rounds = 0
        while time.monotonic() - down_at < OUTAGE_S:
            statuses: dict[tuple[int, str], int] = {}
            accepted = accepting(cluster, names, keys, f"outage-{rounds}", statuses=statuses)
            assert accepted == {p: [actives[p]] for p in keys}, (rounds, accepted, statuses)
            rounds += 1
            time.sleep(0.3)
        assert time.monotonic() - down_at >= OUTAGE_S
        etcd.restart() if outage == "restart" else etcd.resume()

        until(lambda: all({n["name"]: n["state"] for n in cluster.view(name)["nodes"]} == dict.fromkeys(names, "up")
                          for name in names), what="every node up once etcd is back")
        until(lambda: replicas_caught_up(cluster), what="every replica in sync after the outage")
        time.sleep(TTL_S)  # a lease TTL: an expiry or a failover would show now
        assert map_history(etcd.url, prefix, idle_s=0.5) == history_before  # no map write: no false failover
        after = {n: _partitions(cluster, n) for n in names}
        assert after == before  # nobody demoted or promoted: same states, same failover logs
        assert all(cluster.view(n)["map"]["revision"] == view["map"]["revision"] for n in names)
        statuses = {}
        back = accepting(cluster, names, keys, "back", statuses=statuses)
        assert back == {p: [actives[p]] for p in keys}, (back, statuses)
        nodes_in_etcd = httpx.post(f"{etcd.url}/v3/kv/range", timeout=10, json={
            "key": _b64(f"{prefix}/nodes/"), "range_end": _b64(f"{prefix}/nodes0"), "count_only": True}).json()
        assert int(nodes_in_etcd["count"]) == 3

        # the watches and the orchestrator work again: a node killed now is failed over
        victim = next(n for n in names if n != cluster.view("n1")["orchestrator"])
        owned = [p for p, node in actives.items() if node == victim]
        cluster.nodes[victim].kill()
        survivors = [n for n in names if n != victim]
        until(lambda: all(cluster.view(n)["map"]["partitions"][p]["active"] in survivors
                          for n in survivors for p in owned), timeout=60, what="the failover after the outage")
        assert_one_history(map_history(etcd.url, prefix, idle_s=0.5))
    finally:
        cluster.stop_all()


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()
