"""The Spark source and indexer over a cluster: a real etcd, three real nodes (8 partitions, 1
replica, lease TTL 5 s), local Spark.

The indexer (``IndexJob``, what ``upr index run`` runs) is given all three URLs and reads in
several batches; after its first batch the active node of some partitions is SIGKILLed, so the
next planning steps meet a dead node and a map that still names it, and go on once the map moved
its partitions to their replicas.  Afterwards the index equals a brute-force read of the cluster,
and only moved partitions were reset (the rollback rule for a partial snapshot across a branch).

Then one task's ``read()`` runs (without Spark, as an executor runs it) with the routes planned
before the kill: it meets the dead node, reads the map again and reads every partition to its
planned end on the new actives, without an item twice.
"""
from __future__ import annotations

import random
import uuid
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from spark_connector.index.functions import FieldIndex
from spark_connector.index.job import BatchProgress, IndexJob
from spark_connector.meta import fetch_routed
from spark_connector.options import Position, parse_options
from spark_connector.retry import RetryPolicy, SourceUnavailable
from spark_connector.progress import resolve_positions, select_partitions
from spark_connector.source import _input_partitions
from spark_connector.task import read_task
from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster, first_map, partition_of, replicas_caught_up, settled, until
from tests.spark.conftest import spark  # noqa: F401  (the shared local session)
from tests.spark.helpers import brute_force, index_rows, random_ops

pytestmark = pytest.mark.slow

PARTS = 8
KEYS = [f"doc-{i:04d}" for i in range(400)]
VICTIM = "n1"


def write_through_map(view: dict[str, Any], ops: list[dict]) -> None:
    """Bulk writes, each op sent to its partition's active node; every one must succeed."""
    urls = {n["name"]: n["url"] for n in view["nodes"]}
    by_node: dict[str, list[dict]] = defaultdict(list)
    for op in ops:
        by_node[view["map"]["partitions"][partition_of(op["key"], PARTS)]["active"]].append(op)
    for node, node_ops in by_node.items():
        for i in range(0, len(node_ops), 500):
            r = httpx.post(f"{urls[node]}/docs/_bulk", params={"durability": "memory"}, json=node_ops[i:i + 500],
                           timeout=60)
            assert r.status_code == 200, r.text[:300]
            assert all(x["status"] == 200 for x in r.json()["results"]), r.text[:300]


def test_indexer_reads_a_cluster_through_a_node_failure(spark, tmp_path: Path, etcd: EtcdProcess) -> None:  # noqa: F811
    cluster = Cluster(tmp_path, etcd.url, partitions=PARTS, replicas=1, initial_nodes=3,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        cluster.start_all(("n1", "n2", "n3"))
        view = first_map(cluster, "n1")
        rng = random.Random(3)
        live: set[str] = set()
        write_through_map(view, random_ops(rng, KEYS, live, 1500))
        until(lambda: replicas_caught_up(cluster), what="every replica in sync")
        servers = ",".join(cluster.nodes[n].url for n in ("n1", "n2", "n3"))
        owned = [p["partition"] for p in view["map"]["partitions"] if p["active"] == VICTIM]
        assert owned, view["map"]

        # one task's work, planned (with its routes) while every node is up
        opts = parse_options({"server": servers, "fetchOffset.numRetries": "8",
                              "fetchOffset.retryIntervalMs": "250"})
        meta, routes = fetch_routed(opts)
        assert routes is not None and {routes[p] for p in owned} == {cluster.nodes[VICTIM].url}
        selected = select_partitions(meta, None)
        planned_end = resolve_positions(Position.LATEST, meta, selected)
        task = _input_partitions(opts, resolve_positions(Position.EARLIEST, meta, selected), planned_end, routes)

        killed: list[int] = []

        def kill_after_first_batch(batch: BatchProgress) -> None:
            if not killed:
                killed.append(batch.batch_id)
                cluster.nodes[VICTIM].kill()

        job = IndexJob(spark, tmp_path / "index", servers, FieldIndex("city"), on_batch=kill_after_first_batch,
                       source_options={"maxOffsetsPerTrigger": "400", "fetchOffset.numRetries": "8",
                                       "fetchOffset.retryIntervalMs": "250"})
        report = job.run()
        assert killed and report.batches > 1, (killed, report)
        assert not report.unavailable, report   # it ran again until the moved partitions were served
        # a batch cut inside a snapshot is a partial snapshot: across the failover's new branch
        # the server's rule rolls it back to the snapshot start, here a reset (onRollback's
        # default) of the moved partitions only
        assert set(report.resets) <= set(owned), (report.resets, owned)
        after = until(lambda: (v := cluster.view("n2"))["map"]["revision"] > view["map"]["revision"]
                      and settled(cluster, v) and v, what="the failover")
        assert all(after["map"]["partitions"][p]["active"] != VICTIM for p in owned)
        urls = {n["name"]: n["url"] for n in after["nodes"] if n["url"]}
        want: set[tuple[str, str, int, int]] = set()
        for entry in after["map"]["partitions"]:   # each key read from its partition's active
            keys = [k for k in KEYS if partition_of(k, PARTS) == entry["partition"]]
            want |= brute_force(urls[entry["active"]], keys)
        assert index_rows(spark, tmp_path / "index") == want

        # the task planned before the kill reads its partitions from their new actives; without
        # retries it stops at the dead node, naming it
        dead = cluster.nodes[VICTIM].url
        no_retry = [replace(part, retry=RetryPolicy(0, 0.25)) for part in task if dead in dict(part.routes).values()]
        assert no_retry
        with pytest.raises(SourceUnavailable, match=f"partitions .*{dead.removeprefix('http://')}.*gave up after 1 attempt"):
            for part in no_retry:
                list(read_task(part))
        rows: list[tuple[int, int, str]] = []
        for part in task:
            for rb in read_task(part):
                rows += zip(rb.column(0).to_pylist(), rb.column(1).to_pylist(), rb.column(2).to_pylist())
        assert len(rows) == len(set(rows)), "an item read twice"
        last = defaultdict(int)
        for p, seqno, _ in rows:
            last[p] = max(last[p], seqno)
        assert {p: last[p] for p in selected} == {p: planned_end.partitions[p].seqno for p in selected}
    finally:
        cluster.stop_all()
