"""The node monitor: once a second, read the node, find events, sample the charts' figures.

The adapter around the pure parts (``app.events_watch.StateWatch``, ``app.ui.history``): it
reads the engine on a reader thread (``all_stats`` walks every partition), the streams and the
cluster view on the loop, and keeps the last reading for ``GET /ui/api/overview``.  WHY one
reading for every page: five open consoles then cost what one costs; the JSON is built at most
once per tick, and only when a page asks.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from app import events as ev
from app.events_watch import Observation, PartitionFacts, StateWatch, cluster_facts
from app.ui.history import DeliveryCounter, RateHistory

log = logging.getLogger("upr.console")

TICK_S = 1.0


@dataclass(slots=True)
class Reading:
    """One tick's view of the node (everything the overview shows)."""

    tick: int
    wall: float
    stats: list[Any]
    counters: dict[str, Any]
    flush_fault: str | None
    cluster: dict[str, Any] | None


def _read_engine(engine: Any) -> tuple[list[Any], dict[str, Any], str | None]:
    fault = engine.flush_fault
    return engine.all_stats(), engine.engine_stats(), (fault.describe() if fault is not None else None)


def node_name(app: Any, engine: Any) -> str:
    """The cluster's name for this node (``--node``), else the engine's node id."""
    cluster = getattr(app.state, "cluster", None)
    return str(getattr(cluster, "name", None) or engine.node_id)


def unclean_restart_event(engine: Any, log_: ev.EventLog, name: str) -> None:
    """The engine opened after a stop that did not flush: each partition began a new history
    branch (failover entry) at its persisted seqno; name them so an operator sees which."""
    if getattr(engine, "opened_clean", True):
        return
    stats = engine.all_stats()
    entries = [{"partition": s.partition, "uuid": str(s.failover_log[0].uuid), "seqno": s.failover_log[0].seqno}
               for s in stats if s.failover_log]
    log_.record(
        ev.EventKind.UNCLEAN_RESTART,
        f"node {name} restarted after an unclean stop: new failover entry in {len(entries)} partition(s); "
        "seqnos continue from each partition's persisted seqno, consumers past it are told to roll back",
        severity=ev.Severity.ERROR, node=name,
        details={"new_failover_entries": entries[:1024]},
    )


class NodeMonitor:
    """The one periodic reading of the node (see the module docstring): it records the events it
    finds whether or not a console is open, and keeps the reading every open page is served."""

    def __init__(self, app: Any, engine: Any, runner: Any, events: ev.EventLog) -> None:
        self._app = app
        self._engine = engine
        self._runner = runner
        self.events = events
        self.history = RateHistory()
        self._deliveries = DeliveryCounter()
        self._watch = StateWatch()
        self._task: asyncio.Task[None] | None = None
        self._tick = 0
        self.reading: Reading | None = None
        self._json: tuple[int, bytes] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="upr-console-monitor")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed reading (engine closing) must not end the monitor
                log.exception("console monitor: reading the node failed")
            await asyncio.sleep(max(0.05, TICK_S - (time.monotonic() - started)))

    async def tick(self) -> Reading:
        stats, counters, fault = await self._runner.read(_read_engine, self._engine)
        cluster_node = getattr(self._app.state, "cluster", None)
        view = cluster_node.view() if cluster_node is not None else None
        self._tick += 1
        reading = Reading(self._tick, time.time(), stats, counters, fault, view)
        positions = {(s.id, p.partition): p.last_sent_seqno
                     for s in self._app.state.streams.statuses() for p in s.partitions}
        self.history.add(wall=reading.wall, monotonic=time.monotonic(), writes=float(counters.get("writes_total", 0)),
                         delivered=float(self._deliveries.delta(positions)),
                         flushes=float(counters.get("flush_count", 0)), queue_bytes=float(counters.get("queue_bytes", 0)))
        observation = Observation(
            node=node_name(self._app, self._engine),
            partitions=tuple(PartitionFacts(s.partition, s.state.value,
                                            (s.failover_log[0].uuid, s.failover_log[0].seqno) if s.failover_log else (0, 0))
                             for s in stats),
            flush_fault=fault,
            cluster=cluster_facts(view) if view is not None else None,
        )
        for found in self._watch.observe(observation):
            self.events.record(found.kind, found.message, severity=found.severity, partition=found.partition,
                               node=found.node, details=found.details)
        self.reading = reading
        return reading

    def overview_json(self, build: Any) -> bytes:
        """The overview of the last reading as JSON bytes, built once per tick (``build(reading)``)."""
        reading = self.reading
        if reading is None:
            raise LookupError("no reading yet")
        cached = self._json
        if cached is not None and cached[0] == reading.tick:
            return cached[1]
        body = orjson.dumps(build(reading))
        self._json = (reading.tick, body)
        return body
