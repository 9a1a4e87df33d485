"""etcd and ``upr server --cluster`` nodes for ``bench.bench_cluster``, owned by one ProcessGroup.

Every process (etcd, nodes, load generators) is spawned through ``bench.suite.procs.ProcessGroup``,
so it is stopped by its PID when the benchmark ends, by return, exception or Ctrl-C, and dies with
the benchmark if that is SIGKILLed.  The etcd binary and its tuning are the test suite's
(``tests/cluster/etcd_server.py``: fast elections, no fsync, data in the run's temporary
directory); the node command line and ready-wait are ``tests/support/server.py``'s, so a node
here starts exactly as in the cluster's end-to-end tests.  Several clusters share one etcd under
distinct key prefixes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.suite.procs import ProcessGroup, free_port, log_tail
from engine.core.keys import encode_key, partition_for_key
from tests.cluster.etcd_server import etcd_binary
from tests.support.server import ROOT, server_command, server_env, wait_for_url

#: the longest a key may be in ``key_in_partition``'s search before it gives up (never reached
#: for a few hundred partitions: a crc32 spreads consecutive suffixes evenly)
_KEY_SEARCH = 1_000_000

#: the nodes' log level (default warning); e.g. BENCH_NODE_LOG_LEVEL=info for a diagnosis
NODE_LOG_LEVEL_ENV = "BENCH_NODE_LOG_LEVEL"


def start_etcd(group: ProcessGroup, workdir: Path, timeout: float = 30.0) -> str:
    """One etcd member on loopback ephemeral ports; its client URL once it answers."""
    client, peer = free_port(), free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log = workdir / "etcd.log"
    proc = group.spawn([
        str(etcd_binary()), "--name", "bench", "--data-dir", str(workdir / "etcd-data"),
        "--listen-client-urls", url, "--advertise-client-urls", url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"bench={peer_url}",
        "--heartbeat-interval", "20", "--election-timeout", "100", "--unsafe-no-fsync", "--log-level", "warn",
        # a diagnosis's extra flags, e.g. "--metrics extensive --experimental-warning-apply-duration 20ms"
        *os.environ.get("UPR_BENCH_ETCD_ARGS", "").split(),
    ], name="etcd", log=log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"etcd exited with {proc.returncode}: {log_tail(log)}")
        try:
            if httpx.post(f"{url}/v3/kv/range", json={"key": "AA=="}, timeout=1).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"etcd did not answer within {timeout:.0f} s: {log_tail(log)}")


def progress(msg: str) -> None:
    """A line on stderr: long phases show they are alive (the figures go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait_for_start() -> tuple[float, float]:
    """In a load or poller process: say ``ready`` (set up, about to work), then read the window
    (two ``time.monotonic()`` values) the benchmark releases every such process with."""
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("bench: stdin closed before the start")
    start_at, stop_at = map(float, line.split())
    return start_at, stop_at


def release_together(procs: list[subprocess.Popen[Any]], lead: float, seconds: float) -> tuple[float, float]:
    """Wait until every process said ``ready``, then give all the same window: it starts ``lead``
    seconds from now (their warm-up) and lasts ``seconds``.  WHY a handshake rather than a time
    fixed at spawn: on a loaded machine a process can take seconds to start, and one that starts
    late would silently measure a shorter window."""
    for proc in procs:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"a benchmark process (pid {proc.pid}) exited before it was ready: {line[:200]!r}")
    start_at = time.monotonic() + lead
    stop_at = start_at + seconds
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{start_at:.6f} {stop_at:.6f}\n".encode())
        proc.stdin.flush()
    return start_at, stop_at


def key_in_partition(partition: int, partitions: int, prefix: str) -> str:
    """The first key ``<prefix>-<n>`` that hashes to ``partition`` (how a probe writes to one partition)."""
    for n in range(_KEY_SEARCH):
        key = f"{prefix}-{n}"
        if partition_for_key(encode_key(key, 250), partitions) == partition:
            return key
    raise ValueError(f"no key with prefix {prefix!r} in partition {partition} of {partitions}")


def partition_of(key: str, partitions: int) -> int:
    return partition_for_key(encode_key(key, 250), partitions)


@dataclass
class Node:
    name: str
    port: int
    data_dir: Path
    proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class BenchCluster:
    """Nodes ``<prefix-name>1..`` of one cluster (its own etcd prefix), started and killed by the bench."""

    group: ProcessGroup
    workdir: Path
    etcd_url: str
    name: str
    partitions: int
    replicas: int
    size: int
    lease_ttl_s: int = 2
    nodes: dict[str, Node] = field(default_factory=dict)
    #: set in every node's environment (a diagnostic such as ``UPR_REPLICATION_TRACE``)
    env: dict[str, str] = field(default_factory=dict)

    def start(self, timeout: float = 90.0) -> BenchCluster:
        """Start every node, then wait until the first map places every partition on live nodes."""
        for i in range(1, self.size + 1):
            name = f"{self.name}{i}"
            self.nodes[name] = Node(name, free_port(), self.workdir / self.name / name / "data")
        for node in self.nodes.values():
            self._spawn(node)
        for node in self.nodes.values():
            self._ready(node, timeout)
        self.wait_until(self.placed_and_followed, timeout, "the first map")
        return self

    def _spawn(self, node: Node) -> None:
        workdir = self.workdir / self.name / node.name
        workdir.mkdir(parents=True, exist_ok=True)
        ready = workdir / "url"
        ready.unlink(missing_ok=True)
        extra = ["--port", str(node.port), "--cluster", "etcd://" + self.etcd_url.removeprefix("http://"),
                 "--node", node.name, "--advertise", node.url, "--replicas", str(self.replicas),
                 "--lease-ttl-s", str(self.lease_ttl_s), "--cluster-prefix", f"/upr/bench/{self.name}",
                 "--cluster-initial-nodes", str(self.size)]
        # a diagnosis may want the nodes' info lines (replication connections, stream ends)
        extra += ["--log-level", os.environ.get(NODE_LOG_LEVEL_ENV, "warning")]
        cmd = server_command(node.data_dir, ready, partitions=self.partitions, extra=extra)
        node.proc = self.group.spawn(cmd, name=f"node {node.name}", log=workdir / "server.log", cwd=ROOT,
                                     env={**server_env(), **self.env})

    def _ready(self, node: Node, timeout: float) -> None:
        assert node.proc is not None
        workdir = self.workdir / self.name / node.name
        wait_for_url(node.proc, workdir / "url", workdir / "server.log", timeout)

    def kill(self, name: str) -> float:
        """SIGKILL ``name``; the monotonic time the signal was sent."""
        node = self.nodes[name]
        assert node.proc is not None
        t = time.monotonic()
        node.proc.send_signal(signal.SIGKILL)
        self.group.stop(node.proc, timeout=10)  # reaps it and forgets its PID
        return t

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.proc is not None:
                self.group.stop(node.proc)

    # ------------------------------------------------------------------ the cluster's view
    def live(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.alive]

    def view(self) -> dict[str, Any]:
        """``GET /cluster`` from the first live node that answers."""
        last: Exception | None = None
        for node in self.live():
            try:
                r = httpx.get(f"{node.url}/cluster", timeout=5)
                if r.status_code == 200:
                    return dict(r.json())
            except httpx.HTTPError as exc:
                last = exc
        raise RuntimeError(f"no live node of cluster {self.name} answered GET /cluster ({last})")

    def actives(self, view: dict[str, Any] | None = None) -> dict[int, str]:
        """Partition -> URL of its active node, per the map."""
        view = view or self.view()
        urls = {n["name"]: n["url"] for n in view["nodes"]}
        return {p["partition"]: urls[p["active"]] for p in view["map"]["partitions"]}

    def placed_and_followed(self) -> bool:
        """Every partition has a live active, every live node's partitions are in the state the
        map gives them, and every replica the map names is in sync with lag 0 (the active's view)."""
        views = {n.name: httpx.get(f"{n.url}/cluster", timeout=5).json() for n in self.live()}
        live = {n.name for n in self.live()}
        newest = max(views.values(), key=lambda v: v["map"]["revision"])
        if newest["map"]["revision"] == 0:
            return False
        wanted_replicas = min(self.replicas, len(live) - 1)
        for node in self.live():
            states = {p["partition"]: p["state"]
                      for p in httpx.get(f"{node.url}/partitions", timeout=5).json()["partitions"]}
            for entry in newest["map"]["partitions"]:
                if entry["active"] not in live or len(entry["replicas"]) < wanted_replicas:
                    return False
                replicas = [r["node"] for r in entry["replicas"]]
                wanted = "active" if entry["active"] == node.name else "replica" if node.name in replicas else "dead"
                if states[entry["partition"]] != wanted:
                    return False
        for name, view in views.items():  # lags are known on the active's node
            if view["map"]["revision"] != newest["map"]["revision"]:
                return False
            for entry in view["map"]["partitions"]:
                if entry["active"] == name and not all(r["in_sync"] and r["lag"] == 0 for r in entry["replicas"]):
                    return False
        return True

    def persisted(self) -> bool:
        """Every live node has persisted every partition up to its high seqno (its flusher is idle)."""
        for node in self.live():
            for part in httpx.get(f"{node.url}/partitions", timeout=5).json()["partitions"]:
                if part["persisted_seqno"] < part["high_seqno"]:
                    return False
        return True

    def wait_until(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = predicate()
                if value:
                    return value
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                last = exc
            time.sleep(0.1)
        logs = " ; ".join(f"{n.name}: {log_tail(self.workdir / self.name / n.name / 'server.log', 2)}"
                          for n in self.nodes.values())
        raise RuntimeError(f"cluster {self.name}: {what} not reached in {timeout:.0f} s (last error: {last}); {logs}")
