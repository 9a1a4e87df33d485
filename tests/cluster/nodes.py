"""Real ``upr server --cluster`` processes on loopback for the cluster's end-to-end tests."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

from engine.core.keys import encode_key, partition_for_key
from tests.support.net import free_port
from tests.support.server import ServerProcess, spawn_server


#: the nodes' lease TTL unless a test says otherwise.  A node renews every third of it, so it
#: survives a keep-alive delayed by about two thirds of it, and its stall check allows a quarter.
#: With 2 s (the minimum) a loaded 2-core machine (load 20-30) starved all three nodes of a test
#: cluster past their deadlines at once while etcd was up: they lost their leases, and a replica
#: that rejoined was still catching up when the fault the test injected needed it.  Every fault
#: test waits on conditions, so a longer TTL costs only the seconds to detect a killed node.
LEASE_TTL_S = 5


class Cluster:
    """etcd at ``etcd_url`` and nodes named ``n1``.. with their own data dirs under ``workdir``."""

    def __init__(self, workdir: Path, etcd_url: str, *, partitions: int, replicas: int, initial_nodes: int,
                 lease_ttl_s: int = LEASE_TTL_S, prefix: str = "/upr/test", tokens: Mapping[str, str] | None = None,
                 env: Mapping[str, str] | None = None, extra_args: Iterable[str] = ()) -> None:
        self.workdir, self.etcd_url = workdir, etcd_url
        self.tokens, self.env, self.extra_args = tokens, env, list(extra_args)
        self.partitions, self.replicas, self.initial_nodes = partitions, replicas, initial_nodes
        self.lease_ttl_s, self.prefix = lease_ttl_s, prefix
        self.nodes: dict[str, ServerProcess] = {}

    def args(self, name: str, port: int) -> list[str]:
        return ["--port", str(port), "--cluster", "etcd://" + self.etcd_url.removeprefix("http://"), "--node", name,
                "--advertise", f"http://127.0.0.1:{port}", "--replicas", str(self.replicas),
                "--lease-ttl-s", str(self.lease_ttl_s), "--cluster-prefix", self.prefix,
                "--cluster-initial-nodes", str(self.initial_nodes), "--flush-interval-ms", "2", *self.extra_args]

    def start(self, name: str) -> ServerProcess:
        return self.start_all([name])[0]

    def start_all(self, names: Iterable[str]) -> list[ServerProcess]:
        """Start the nodes side by side and wait for each: a node's start is mostly its imports, and
        a cluster's nodes need not take turns for them.  Each is in ``nodes`` from its spawn on, so
        ``stop_all`` reaps a node that never got ready."""
        spawned = []
        for name in names:
            port = free_port()
            started = spawn_server(self.workdir / name, data_dir=self.workdir / name / "data",
                                   partitions=self.partitions, args=self.args(name, port), tokens=self.tokens,
                                   env=self.env)
            self.nodes[name] = started.server
            spawned.append(started)
        return [started.wait_ready(timeout=60) for started in spawned]

    def stop_all(self) -> None:
        for node in self.nodes.values():
            node.kill()

    def view(self, name: str) -> dict[str, Any]:
        r = httpx.get(f"{self.nodes[name].url}/cluster", timeout=10, headers=self.nodes[name].headers)
        assert r.status_code == 200, r.text
        return r.json()

    def live(self) -> list[str]:
        return [n for n, node in self.nodes.items() if node.proc.poll() is None]


def until(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``predicate`` (errors count as not yet) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, AssertionError, KeyError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout:.0f}s (last error: {last})")


def partition_of(key: str, partitions: int) -> int:
    return partition_for_key(encode_key(key, 250), partitions)


def placed(view: dict[str, Any]) -> bool:
    return view["map"]["revision"] > 0 and all(p["active"] for p in view["map"]["partitions"])


def first_map(cluster: "Cluster", name: str) -> dict[str, Any]:
    """``name``'s view once a map has placed every partition and every live node follows it."""
    def ready() -> dict[str, Any] | None:
        view = cluster.view(name)
        return view if placed(view) and settled(cluster, view) else None

    return until(ready, what="the first map")


def started_in_sync(cluster: "Cluster", names: Iterable[str], keys: Iterable[str] = (),
                    tag: str = "v1") -> dict[str, Any]:
    """``names`` started, the first map placed, ``keys`` written through it, every replica in
    sync: the first map's view."""
    names = list(names)
    cluster.start_all(names)
    view = first_map(cluster, names[0])
    keys = list(keys)
    if keys:
        write_routed(cluster, view, keys, tag)
    until(lambda: replicas_caught_up(cluster), what="every replica in sync")
    return view


def settled(cluster: "Cluster", view: dict[str, Any]) -> bool:
    """Every live node's partitions are in the state ``view``'s map gives them (it followed the map)."""
    for name in cluster.live():
        states = {p["partition"]: p["state"] for p in
                  httpx.get(f"{cluster.nodes[name].url}/partitions", timeout=10).json()["partitions"]}
        for entry in view["map"]["partitions"]:
            wanted = ("active" if entry["active"] == name else
                      "replica" if name in [r["node"] for r in entry["replicas"]] else "dead")
            if states[entry["partition"]] != wanted:
                return False
    return True


def following(cluster: "Cluster", name: str) -> dict[str, Any] | None:
    """``name``'s view once every live node follows the map in it, else None.  Wait on this, not
    on ``settled`` with a view taken earlier: the map may move on meanwhile (a dead node's replica
    slots replaced, a rebalance), and then no node follows the earlier one any more."""
    view = cluster.view(name)
    return view if settled(cluster, view) else None


def write_routed(cluster: Cluster, view: dict[str, Any], keys: Iterable[str], tag: str) -> dict[str, dict[str, Any]]:
    """``memory`` sets of ``keys``, each sent to its partition's active node; the acknowledged results."""
    urls = {n["name"]: n["url"] for n in view["nodes"]}
    by_node: dict[str, list[dict[str, str]]] = {}
    for key in keys:
        active = view["map"]["partitions"][partition_of(key, cluster.partitions)]["active"]
        by_node.setdefault(active, []).append({"op": "set", "key": key, "value": f"{tag}-{key}"})
    acked: dict[str, dict[str, Any]] = {}
    for node, ops in by_node.items():
        r = httpx.post(f"{urls[node]}/docs/_bulk", params={"durability": "memory"}, json=ops, timeout=60)
        assert r.status_code == 200, r.text[:300]
        for op, result in zip(ops, r.json()["results"], strict=True):
            assert result["status"] == 200, result
            acked[op["key"]] = {"value": op["value"], "partition": result["partition"], "seqno": result["seqno"]}
    return acked


def replicas_caught_up(cluster: Cluster) -> bool:
    """Every replica, as its active's node sees it, is in sync with lag 0."""
    for name in cluster.live():
        view = cluster.view(name)
        if not placed(view):
            return False
        for entry in view["map"]["partitions"]:
            if entry["active"] != name:
                continue
            if len(entry["replicas"]) < min(cluster.replicas, len(cluster.live()) - 1):
                return False
            if not all(r["in_sync"] and r["lag"] == 0 for r in entry["replicas"]):
                return False
    return True
