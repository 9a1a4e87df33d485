"""Cluster figures on ``/metrics``: table tests of the collector, and a real two-node cluster."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.cluster.metrics import ClusterCollector
from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster, first_map, replicas_caught_up, until, write_routed


def replica(node: str, in_sync: bool, lag: int | None) -> dict[str, Any]:
    return {"node": node, "seqno": 0, "in_sync": in_sync, "lag": lag}


def view(**overrides: Any) -> dict[str, Any]:
    base = {
        "node": "n1", "fenced": False, "orchestrator": "n1",
        "nodes": [{"name": "n1", "state": "up"}, {"name": "n2", "state": "up"}, {"name": "n3", "state": "down"}],
        "map": {"revision": 7, "partitions": [
            {"partition": 0, "active": "n1", "replicas": [replica("n2", True, 0)]},
            {"partition": 1, "active": "n1", "replicas": [replica("n3", False, 12)]},
            {"partition": 2, "active": "n2", "replicas": [replica("n1", True, None)]},
            {"partition": 3, "active": None, "replicas": []},
        ]},
    }
    return {**base, **overrides}


def scrape(v: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: v))
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.mark.parametrize(("name", "labels", "expected"), [
    ("upr_cluster_map_revision", (), 7.0),
    ("upr_cluster_orchestrator", (), 1.0),
    ("upr_cluster_fenced", (), 0.0),
    ("upr_cluster_nodes", (("state", "up"),), 2.0),
    ("upr_cluster_nodes", (("state", "down"),), 1.0),
    ("upr_cluster_partitions", (("role", "active"),), 2.0),
    ("upr_cluster_partitions", (("role", "replica"),), 1.0),
    ("upr_cluster_under_replicated_partitions", (), 1.0),
    ("upr_cluster_unavailable_partitions", (), 1.0),
    ("upr_cluster_replica_lag", (("partition", "1"), ("replica", "n3")), 12.0),
    ("upr_cluster_replica_in_sync", (("partition", "1"), ("replica", "n3")), 0.0),
    ("upr_cluster_replica_in_sync", (("partition", "0"), ("replica", "n2")), 1.0),
])
def test_the_collector_reads_the_view(name: str, labels: tuple[tuple[str, str], ...], expected: float) -> None:
    assert scrape(view())[(name, labels)] == expected


def test_only_the_actives_node_reports_replica_figures() -> None:
    samples = scrape(view(node="n2", orchestrator="n1", fenced=True))
    assert samples[("upr_cluster_orchestrator", ())] == 0.0
    assert samples[("upr_cluster_fenced", ())] == 1.0
    assert samples[("upr_cluster_partitions", (("role", "active"),))] == 1.0
    assert samples[("upr_cluster_partitions", (("role", "replica"),))] == 1.0
    assert samples[("upr_cluster_under_replicated_partitions", ())] == 0.0
    lags = {k for k in samples if k[0] == "upr_cluster_replica_lag"}
    assert lags == set(), "a replica's lag with no known figure is left out, not reported as 0"


def test_a_real_node_reports_the_map_it_follows(tmp_path: Path, etcd: EtcdProcess) -> None:
    cluster = Cluster(tmp_path, etcd.url, partitions=8, replicas=1, initial_nodes=2,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        cluster.start_all(("n1", "n2"))
        current = first_map(cluster, "n1")
        write_routed(cluster, current, [f"k{i}" for i in range(40)], "v")
        until(lambda: replicas_caught_up(cluster), what="every replica in sync")
        for name in ("n1", "n2"):
            text = httpx.get(f"{cluster.nodes[name].url}/metrics", timeout=10).text
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for f in text_string_to_metric_families(text) for s in f.samples}
            seen = cluster.view(name)
            mine = sum(1 for p in seen["map"]["partitions"] if p["active"] == name)
            assert samples[("upr_cluster_map_revision", ())] == seen["map"]["revision"]
            assert samples[("upr_cluster_partitions", (("role", "active"),))] == mine
            assert samples[("upr_cluster_under_replicated_partitions", ())] == 0
            assert samples[("upr_cluster_nodes", (("state", "up"),))] == 2
    finally:
        cluster.stop_all()


def test_replication_counters_are_counters() -> None:
    class Replication:
        undos, resets, inline, hops, progress_txns = 1, 2, 30, 4, 5

    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: view(), Replication()))
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(generate_latest(registry).decode()) for s in family.samples}
    assert got[("upr_cluster_replica_applies_total", (("path", "inline"),))] == 30.0
    assert got[("upr_cluster_replica_applies_total", (("path", "thread"),))] == 4.0
    assert got[("upr_cluster_replica_progress_writes_total", ())] == 5.0
    assert got[("upr_cluster_replica_rollbacks_total", (("path", "resync"),))] == 2.0


def test_the_replication_paths_events_and_etcd_requests_are_counters() -> None:
    from app.cluster.replication import ReplicationCounts

    class Etcd:
        requests = 12

    class Replication:
        undos = resets = inline = hops = progress_txns = 0
        counts = ReplicationCounts(messages=40, takes=5, acks=9, ack_messages=4, ack_looks=4, persist_handoffs=2,
                                   flow_acks=1, packed_passes=3, packed_sections=11)
        etcd = Etcd()

    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: view(), Replication()))
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(generate_latest(registry).decode()) for s in family.samples}
    events = {labels[0][1]: value for (name, labels), value in got.items()
              if name == "upr_cluster_replication_events_total"}
    assert events == {"messages": 40.0, "takes": 5.0, "acks": 9.0, "ack_messages": 4.0, "ack_looks": 4.0,
                      "persist_handoffs": 2.0, "flow_acks": 1.0, "packed_passes": 3.0,
                      "packed_sections": 11.0}
    assert got[("upr_cluster_etcd_requests_total", ())] == 12.0
