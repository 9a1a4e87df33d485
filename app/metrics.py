"""Prometheus metrics: one registry per app (so tests and several apps in one process
never collide), request metrics from a pure ASGI middleware, and engine/stream figures
read at scrape time by a custom collector rather than kept up to date on every write.

Names other modules update:
    ``Metrics.rollbacks``       stream endpoint: rollbacks issued, by reason
    ``Metrics.stream_bytes``    stream endpoint: bytes sent
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.core.types import PartitionState

if TYPE_CHECKING:
    from app.streams_registry import StreamRegistry
    from engine.engine import Engine

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "upr_http_requests", "HTTP requests handled", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "upr_http_request_duration_seconds", "HTTP request latency", ["method", "route"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.bulk_items = Counter("upr_bulk_items", "bulk operations by outcome", ["outcome"], registry=self.registry)
        self.rollbacks = Counter("upr_stream_rollbacks", "rollbacks issued to consumers", ["reason"], registry=self.registry)
        self.stream_bytes = Counter("upr_stream_sent_bytes", "bytes sent on streams", registry=self.registry)
        self._engine_collector: EngineCollector | None = None
        self._cluster_collector: Collector | None = None

    def attach(self, engine: Engine, streams: StreamRegistry) -> None:
        """Start reporting engine and stream figures (called once the engine is open)."""
        self.detach()
        self._engine_collector = EngineCollector(engine, streams)
        self.registry.register(self._engine_collector)

    def attach_cluster(self, collector: Collector) -> None:
        """Start reporting a cluster node's figures (``app.cluster.metrics``)."""
        self._cluster_collector = collector
        self.registry.register(collector)

    def detach(self) -> None:
        if self._engine_collector is not None:
            self.registry.unregister(self._engine_collector)
            self._engine_collector = None
        if self._cluster_collector is not None:
            self.registry.unregister(self._cluster_collector)
            self._cluster_collector = None


def _metric_name(key: str) -> str:
    return "upr_engine_" + "".join(c if c.isalnum() else "_" for c in key)


class EngineCollector(Collector):
    """Reads the engine at scrape time (called from a reader thread, never the loop)."""

    def __init__(self, engine: Engine, streams: StreamRegistry) -> None:
        self._engine = engine
        self._streams = streams

    def describe(self) -> list[Metric]:
        return []  # dynamic: the engine's counters are discovered at collect time

    def collect(self) -> Iterator[Metric]:
        per = {
            "high_seqno": GaugeMetricFamily("upr_partition_high_seqno", "high seqno", labels=["partition"]),
            "persisted_seqno": GaugeMetricFamily("upr_partition_persisted_seqno", "persisted seqno", labels=["partition"]),
            "purge_seqno": GaugeMetricFamily("upr_partition_purge_seqno", "purge seqno", labels=["partition"]),
            "item_count": GaugeMetricFamily("upr_partition_items", "live items", labels=["partition"]),
            "queue_depth": GaugeMetricFamily("upr_partition_queue_depth", "unpersisted writes", labels=["partition"]),
            "queue_bytes": GaugeMetricFamily("upr_partition_queue_bytes", "unpersisted bytes", labels=["partition"]),
        }
        active = GaugeMetricFamily("upr_partition_active", "1 if the partition is active", labels=["partition"])
        for st in self._engine.all_stats():
            label = [str(st.partition)]
            for name, family in per.items():
                family.add_metric(label, float(getattr(st, name)))
            active.add_metric(label, 1.0 if st.state is PartitionState.ACTIVE else 0.0)
        yield from per.values()
        yield active
        for key, value in sorted(self._engine.engine_stats().items()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                name = _metric_name(key)
                if key.endswith(("_total", "_count")):
                    yield CounterMetricFamily(name.removesuffix("_total"), f"engine counter {key}", value=float(value))
                else:
                    yield GaugeMetricFamily(name, f"engine figure {key}", value=float(value))
        connected = GaugeMetricFamily("upr_streams_connected", "open stream connections", value=len(self._streams))
        yield connected
        lag = GaugeMetricFamily("upr_stream_lag", "items behind the high seqno", labels=["stream", "partition"])
        for status in self._streams.statuses():
            for ps in status.partitions:
                lag.add_metric([f"{status.id}:{status.name}", str(ps.partition)], float(ps.lag))
        yield lag


class RequestCounts:
    """Each request counted and timed by method, route template (bounded labels) and status;
    the label children are looked up once per combination."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def done(self, method: str, template: str, status: int, seconds: float) -> None:
        key = (method, template, status)
        children = self._children.get(key)
        if children is None:
            children = (
                self.metrics.requests.labels(method, template, str(status)),
                self.metrics.latency.labels(method, template),
            )
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)


class MetricsMiddleware:
    """Counts and times each request by route template (not raw path: bounded labels)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.counts = RequestCounts(metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.counts.done(scope["method"], template, status, time.perf_counter() - start)


def middleware_factory(metrics: Metrics) -> Callable[[ASGIApp], MetricsMiddleware]:
    return lambda app: MetricsMiddleware(app, metrics)
