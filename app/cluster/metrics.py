"""Prometheus figures of a cluster node, read from ``GET /cluster``'s view at scrape time.

WHY these: an operator's first questions about a replicated feed are Kafka's
(``UnderReplicatedPartitions``, ``ActiveControllerCount``) and Patroni's (who leads, is the
node fenced): is every partition this node is active for fully replicated, how far behind is
each replica, which map is in force and who orchestrates.  They are derived from the same view
``GET /cluster`` answers, so the two can never disagree.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ClusterCollector"]


#: the durability levels and outcomes counted, always reported (zeros included) so a rate is
#: defined from the first scrape
DURABLE_LEVELS = ("majority", "persist_majority")
DURABLE_OUTCOMES = ("ambiguous", "impossible")


class ClusterCollector(Collector):
    """Turns a cluster view (``ClusterNode.view()``) into gauges at each scrape, and the node's
    counters into counters: replica rollbacks by how they were answered (``replication``'s
    ``undos`` and ``resets``), durable writes that failed by outcome and level (``durable``'s
    ``failures``).  WHY the rollback counter: an undo costs the items above the rollback point,
    a resync the whole partition, and how often each happens is what an operator sizes for."""

    def __init__(self, view: Callable[[], Mapping[str, Any]], replication: Any = None, durable: Any = None) -> None:
        self._view = view
        self._replication = replication
        self._durable = durable

    def describe(self) -> list[Metric]:
        return []  # labels depend on the map: discovered at collect time

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        me = view["node"]
        yield GaugeMetricFamily("upr_cluster_map_revision", "revision of the partition map in force on this node",
                                value=float(view["map"]["revision"]))
        yield GaugeMetricFamily("upr_cluster_orchestrator", "1 if this node is the orchestrator",
                                value=1.0 if view.get("orchestrator") == me else 0.0)
        yield GaugeMetricFamily("upr_cluster_fenced", "1 while this node lost its lease and serves nothing",
                                value=1.0 if view.get("fenced") else 0.0)
        nodes = GaugeMetricFamily("upr_cluster_nodes", "nodes in the cluster by state", labels=["state"])
        states: dict[str, int] = {}
        for node in view["nodes"]:
            states[node["state"]] = states.get(node["state"], 0) + 1
        for state in ("up", "down", *sorted(set(states) - {"up", "down"})):
            nodes.add_metric([state], float(states.get(state, 0)))
        yield nodes

        roles = GaugeMetricFamily("upr_cluster_partitions", "partitions this node holds, by role", labels=["role"])
        active = replica = under = unavailable = 0
        lag = GaugeMetricFamily("upr_cluster_replica_lag", "seqnos a replica is behind its active (on the active)",
                                labels=["partition", "replica"])
        in_sync = GaugeMetricFamily("upr_cluster_replica_in_sync", "1 if the replica is in sync (on the active)",
                                    labels=["partition", "replica"])
        for entry in view["map"]["partitions"]:
            if entry["active"] is None:
                unavailable += 1
            if any(r["node"] == me for r in entry["replicas"]):
                replica += 1
            if entry["active"] != me:
                continue
            active += 1
            if any(not r["in_sync"] for r in entry["replicas"]):
                under += 1
            for r in entry["replicas"]:
                labels = [str(entry["partition"]), r["node"]]
                in_sync.add_metric(labels, 1.0 if r["in_sync"] else 0.0)
                if r.get("lag") is not None:
                    lag.add_metric(labels, float(r["lag"]))
        roles.add_metric(["active"], float(active))
        roles.add_metric(["replica"], float(replica))
        yield roles
        yield GaugeMetricFamily(
            "upr_cluster_under_replicated_partitions",
            "partitions this node is active for with a replica not in sync (Kafka's UnderReplicatedPartitions)",
            value=float(under))
        yield GaugeMetricFamily("upr_cluster_unavailable_partitions", "partitions the map gives no active node",
                                value=float(unavailable))
        yield lag
        yield in_sync
        if self._replication is not None:
            rollbacks = CounterMetricFamily("upr_cluster_replica_rollbacks",
                                            "rollbacks of this node's replica copies, by how they were answered: "
                                            "undo (cut back to the rollback seqno) or resync (from 0)", labels=["path"])
            rollbacks.add_metric(["undo"], float(self._replication.undos))
            rollbacks.add_metric(["resync"], float(self._replication.resets))
            yield rollbacks
            applies = CounterMetricFamily("upr_cluster_replica_applies",
                                          "received runs applied to this node's replica copies, by where: on the "
                                          "event loop (inline) or on a worker thread (its locks were busy, or a large "
                                          "run)", labels=["path"])
            applies.add_metric(["inline"], float(self._replication.inline))
            applies.add_metric(["thread"], float(self._replication.hops))
            yield applies
            published = CounterMetricFamily("upr_cluster_replica_progress_writes",
                                            "etcd transactions that published this node's replica progress")
            published.add_metric([], float(self._replication.progress_txns))
            yield published
            counts = getattr(self._replication, "counts", None)
            if counts is not None:
                events = CounterMetricFamily(
                    "upr_cluster_replication_events",
                    "the replica side's per-wake-up work, by event: messages received from actives, takes "
                    "(applier wake-ups), acks and ack_messages sent, ack_looks (acker wake-ups), "
                    "persist_handoffs (flusher rounds handed to the loop), flow_acks (flow-control acks), "
                    "packed_passes and packed_sections (packed passes received and the batches they held)",
                    labels=["event"])
                for event in ("messages", "takes", "acks", "ack_messages", "ack_looks", "persist_handoffs",
                              "flow_acks", "packed_passes", "packed_sections"):
                    events.add_metric([event], float(getattr(counts, event)))
                yield events
            etcd = getattr(self._replication, "etcd", None)
            if etcd is not None and hasattr(etcd, "requests"):
                yield CounterMetricFamily("upr_cluster_etcd_requests", "requests this node sent to etcd",
                                          value=float(etcd.requests))
        if self._durable is not None:
            failures = CounterMetricFamily("upr_cluster_durable_write_failures",
                                           "durable writes on this node answered ambiguous (504: may have been applied) "
                                           "or impossible (503: not applied), by durability level",
                                           labels=["outcome", "level"])
            counts = dict(self._durable.failures)
            for outcome in DURABLE_OUTCOMES:
                for level in DURABLE_LEVELS:
                    failures.add_metric([outcome, level], float(counts.get((outcome, level), 0)))
            yield failures
