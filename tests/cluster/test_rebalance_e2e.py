"""Rebalance end to end: real etcd, real nodes, 2 -> 3 -> 2 with a ``majority`` writer and a
consumer tailing the whole cluster.

n3 starts on an empty data dir and holds nothing until ``upr cluster add n3`` rebalances (its
copies stream to it as replicas first); ``upr cluster remove n3`` moves everything back.  Each
active that moves is handed over by takeover, so: zero acknowledged writes lost, zero rollbacks
told to the consumer, zero new failover-log entries on any partition, every write refused with a
retryable error succeeded on retry, and the consumer's final state equals the cluster's."""
from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import cli
from clients import Consumer, Deletion, Mutation, PartitionReset, Rollback
from clients.errors import HttpError
from clients.http import HttpApi
from engine.cluster.partition_map import PartitionMap, copies_per_node
from engine.protocol.client.session import UNSAVED_PROGRESS
from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster, first_map, settled, until

pytestmark = pytest.mark.slow

PARTS = 8


class Writer(threading.Thread):
    """Sequential ``majority`` puts of distinct keys through the cluster address; a refused write
    is retried until it succeeds (503: the takeover's pause; 421: a map just changed)."""

    def __init__(self, server: str) -> None:
        super().__init__(daemon=True)
        self.server, self.stop = server, threading.Event()
        self.acked: dict[str, tuple[int, int, bytes]] = {}
        self.retried: set[str] = set()
        self.refusals: dict[int, int] = defaultdict(int)
        self.errors: list[str] = []

    def run(self) -> None:
        with HttpApi(self.server) as api:
            i = 0
            while not self.stop.is_set():
                key, value = f"w-{i}", f"v-{i}".encode()
                try:
                    result = api.put(key, value, durability="majority")
                except HttpError as exc:
                    if exc.status in (503, 421):
                        self.retried.add(key)
                        self.refusals[exc.status] += 1
                        time.sleep(0.01)
                        continue
                    self.errors.append(f"{key}: {exc.status} {exc.message}")
                    return
                except Exception as exc:  # noqa: BLE001 - reported by the test
                    self.errors.append(f"{key}: {exc!r}")
                    return
                self.acked[key] = (result["partition"], result["seqno"], value)
                i += 1


class Tail(threading.Thread):
    """A ``clients.Consumer`` given the cluster's URLs, on its own loop: key -> value per
    partition, the rollbacks the servers told it, and its committed positions."""

    def __init__(self, servers: str, state: Path) -> None:
        super().__init__(daemon=True)
        self.servers, self.state = servers, state
        self.data: dict[int, dict[str, bytes]] = defaultdict(dict)
        self.rollbacks: list[Rollback] = []
        self.committed: dict[int, int] = {}
        self.failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failed = exc

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        try:
            await self._consume()
        except asyncio.CancelledError:
            pass

    async def _consume(self) -> None:
        async with Consumer(self.servers, name="rebalance-tail", start="beginning", state=self.state,
                            open_timeout=5) as consumer:
            async for event in consumer:
                if isinstance(event, Mutation):
                    self.data[event.partition][event.key] = event.value
                elif isinstance(event, Deletion):
                    self.data[event.partition].pop(event.key, None)
                elif isinstance(event, PartitionReset):
                    self.data[event.partition].clear()
                elif isinstance(event, Rollback) and event.reason != UNSAVED_PROGRESS:
                    self.rollbacks.append(event)
                self.committed = {p: off.seqno for p, off in consumer.committed().items()}

    def close(self) -> None:
        if self._loop is not None and self._task is not None and self.is_alive():
            self._loop.call_soon_threadsafe(self._task.cancel)
        self.join(timeout=30)


def logs(url: str) -> dict[int, list[tuple[int, int]]]:
    parts = httpx.get(f"{url}/partitions", timeout=10).json()["partitions"]
    return {p["partition"]: [(e["uuid"], e["seqno"]) for e in p["failover_log"]] for p in parts}


def view_map(view: dict[str, Any]) -> PartitionMap:
    """``GET /cluster``'s map (replicas with their progress) as a ``PartitionMap``."""
    return PartitionMap.from_json({"revision": view["map"]["revision"], "partitions": [
        {**e, "replicas": [r["node"] for r in e["replicas"]]} for e in view["map"]["partitions"]]})


def balanced(view: dict[str, Any], nodes: list[str]) -> bool:
    counts = copies_per_node(view_map(view).placements)
    actives = [counts.get(n, (0, 0))[0] for n in nodes]
    replicas = [counts.get(n, (0, 0))[1] for n in nodes]
    return (set(counts) == set(nodes) and max(actives) - min(actives) <= 1
            and max(replicas) - min(replicas) <= 1)


def test_rebalance_two_to_three_to_two_nodes_loses_nothing_and_forks_nothing(
        tmp_path: Path, etcd: EtcdProcess, capsys: pytest.CaptureFixture[str]) -> None:
    # a lease long enough that a loaded machine's stalls cost no node its lease: a failover (a
    # legitimate new history branch) is not what this test is about
    cluster = Cluster(tmp_path, etcd.url, partitions=PARTS, replicas=1, initial_nodes=2, lease_ttl_s=6,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    writer = tail = None
    try:
        cluster.start_all(["n1", "n2"])
        view = first_map(cluster, "n1")
        n1, n2 = cluster.nodes["n1"].url, cluster.nodes["n2"].url
        servers = f"{n1},{n2}"
        writer = Writer(servers)
        writer.start()
        tail = Tail(servers, tmp_path / "tail")
        tail.start()
        t0 = time.monotonic()
        until(lambda: len(writer.acked) >= 30, what="the writer under way")
        phases = {"30 writes": time.monotonic() - t0}
        before = {e["partition"]: logs({"n1": n1, "n2": n2}[e["active"]])[e["partition"]]
                  for e in view["map"]["partitions"]}

        # a new node with an empty data dir holds nothing until it is added
        cluster.start("n3")
        until(lambda: any(n["name"] == "n3" and n["state"] == "up" for n in cluster.view("n1")["nodes"]),
              what="n3 up")
        assert "n3" not in view_map(cluster.view("n1")).nodes()

        t0 = time.monotonic()
        assert cli.main(["cluster", "add", "n3", "--server", n1, "--timeout", "60"]) == 0, capsys.readouterr().err
        phases["add n3"] = time.monotonic() - t0
        out = capsys.readouterr().out
        assert "rebalance done" in out and "partition(s) moved" in out, out
        three = cluster.view("n1")
        assert balanced(three, ["n1", "n2", "n3"]), three["map"]
        assert len(view_map(three).active_partitions("n3")) >= 2
        until(lambda: settled(cluster, cluster.view("n1")), what="every node following the 3-node map")
        acked_at_three = len(writer.acked)

        t0 = time.monotonic()
        assert cli.main(["cluster", "remove", "n3", "--server", n2, "--timeout", "60"]) == 0, capsys.readouterr().err
        phases["remove n3"] = time.monotonic() - t0
        assert "rebalance done" in capsys.readouterr().out
        two = cluster.view("n2")
        assert "n3" not in view_map(two).nodes() and balanced(two, ["n1", "n2"])
        until(lambda: writer.errors or len(writer.acked) >= acked_at_three + 20, timeout=30,
              what="the writer going on after the moves")
        writer.stop.set()
        writer.join(timeout=30)
        assert not writer.errors, writer.errors

        # every acknowledged write is on its partition's active, every retried one included
        urls = {n["name"]: n["url"] for n in two["nodes"] if n["url"]}
        final = {e["partition"]: e["active"] for e in two["map"]["partitions"]}
        assert writer.retried <= writer.acked.keys()
        with httpx.Client(timeout=10) as http:
            for key, (p, seqno, value) in writer.acked.items():
                r = http.get(f"{urls[final[p]]}/docs/{key}")
                assert r.status_code == 200 and r.content == value, (key, p, seqno, r.status_code)
        # takeovers only: every partition's failover log is as it was before any move
        for p, active in final.items():
            assert logs(urls[active])[p] == before[p], p

        highs = {p: httpx.get(f"{urls[a]}/partitions/{p}", timeout=10).json()["high_seqno"] for p, a in final.items()}
        until(lambda: tail.failed is None and all(tail.committed.get(p, 0) >= h for p, h in highs.items()),
              timeout=60, what=f"the consumer drained to every active's high seqno {highs} (it is at "
                               f"{tail.committed}, {tail.failed!r})")
        tail.close()
        assert tail.failed is None, tail.failed
        assert not tail.rollbacks, tail.rollbacks
        with httpx.Client(timeout=10) as http:
            for p, active in final.items():
                theirs = {key: value for key, (q, _s, value) in writer.acked.items() if q == p}
                assert tail.data[p] == theirs, p
        # operator errors: one line, exit 1; nothing in progress is said so
        assert cli.main(["cluster", "remove", "zz", "--server", n1]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "unknown node 'zz'" in err, err
        assert cli.main(["cluster", "add", "n9", "--server", n1]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "node 'n9' is not up" in err, err
        assert cli.main(["cluster", "rebalance", "--stop", "--server", n1]) == 0
        assert cli.main(["cluster", "status", "--server", n1]) == 0
        out = capsys.readouterr().out
        assert "no rebalance running" in out and "no rebalance in progress" in out
        assert "removed nodes (no new copy goes there): n3" in out
        print(f"\nrebalance 2->3->2: {len(writer.acked)} majority writes acknowledged, {len(writer.retried)} "
              f"retried after {dict(writer.refusals)} refusals; "
              + ", ".join(f"{k} {v:.1f}s" for k, v in phases.items()))
    finally:
        if writer is not None:
            writer.stop.set()
        if tail is not None:
            tail.close()
        cluster.stop_all()
