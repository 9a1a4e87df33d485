"""The stream server of one app: what every ``GET /stream`` connection shares while the engine
is open.

The app's lifespan makes one ``StreamServer`` after opening the engine and closes it before
closing the engine, so its parts live exactly as long as the engine they serve:

    hub      engine change notifications -> the event loop, coalesced (hub.py), and the encoded
             readings every connection at the same position shares (shared.py)
    jobs     the connections' reader-thread jobs batched into one hop per wake-up (jobs.py)
    slots    connection limits, per server and per client (slots.py)
    ceilings visible ceilings of ``persisted`` / ``majority`` consumers and their wake-ups (ceilings.py)
    streams  the registry ``GET /streams`` reads; ``close`` ends every connection's streams

WHY an object owned by the lifespan: the hub needs the running loop and the engine, so it used
to be made by the first WebSocket and patched onto ``app.state``; an app that reopened its
engine had to notice the stale hub itself.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from app.stream.ceilings import CeilingProvider, VisibleCeilings
from app.stream.connection import ReplicaAckSink, StreamConnection, StreamLimits
from app.stream.hub import ChangeHub
from app.stream.jobs import JobBatcher
from app.stream.passes import ENCODERS
from app.stream.shared import SharedReadings
from app.stream.slots import ConnectionSlots
from app.streams_registry import StreamRegistry
from engine.protocol.messages import Visibility

__all__ = ["StreamServer"]


class StreamServer:
    def __init__(self, *, engine: Any, runner: Any, limits: StreamLimits, streams: StreamRegistry,
                 metrics: Any, stream_metrics: Any,
                 ceilings: Mapping[Visibility, CeilingProvider] | None = None) -> None:
        """``ceilings``: per visibility, the callable giving a partition's visible ceiling, e.g.
        ``{Visibility.MAJORITY: lambda p: tracker.majority_seqno(p, False)}`` in a cluster
        (``persisted`` defaults to the engine's persisted seqno; a visibility without one is
        not capped).  A provider is called on the event loop and on reader threads, right after
        a snapshot: it must be cheap and safe from any thread."""
        self.engine = engine
        self.runner = runner
        self.limits = limits
        self.streams = streams
        self.slots = ConnectionSlots(limits.max_connections, limits.max_connections_per_client)
        self.jobs = JobBatcher(runner.read)
        self.hub = ChangeHub(engine.add_listener, asyncio.get_running_loop(), self.jobs, batch_listener=True,
                             shared=lambda cache: SharedReadings(
                                 engine, ENCODERS, cache, max_items=limits.inline_items,
                                 frame_bytes=limits.frame_bytes, frame_items=limits.frame_items))
        self.ceilings = VisibleCeilings(engine, asyncio.get_running_loop(), ceilings)
        self._metrics = metrics
        self._stream_metrics = stream_metrics
        #: in a cluster, who serves a partition (``ClusterNode.misdirected``): named in not_my_partition
        self.owner_of: Callable[[int], dict[str, Any]] | None = None
        #: in a cluster, where replication connections' acks go (``app.cluster.durable.DurableWrites``)
        self.replica_acks: ReplicaAckSink | None = None

    async def serve(self, ws: Any, *, may_replicate: bool = True) -> None:
        """Accept ``ws`` and run its connection until it is over (the caller holds its slot);
        ``may_replicate``: whether the caller may open a replication connection (admin role)."""
        await ws.accept()
        peer = ws.client
        remote = f"{peer.host}:{peer.port}" if peer else "?"
        metrics, extra = self._metrics, self._stream_metrics
        conn = StreamConnection(
            ws,
            engine=self.engine,
            read=self.runner.read,
            hub=self.hub,
            limits=self.limits,
            remote=remote,
            on_rollback=lambda reason: metrics.rollbacks.labels(reason).inc(),
            on_bytes=metrics.stream_bytes.inc,
            on_delivery=extra.delivery.observe,
            on_cursor_drop=extra.cursor_drops.inc,
            owner_of=self.owner_of,
            ceilings=self.ceilings,
            replica_acks=self.replica_acks,
            may_replicate=may_replicate,
        )
        self.streams.register(conn)
        try:
            await conn.run()
        finally:
            self.streams.unregister(conn)

    def ceiling_advanced(self, partition: int) -> None:
        """``partition``'s visible ceiling may have advanced (e.g. a majority of its copies now
        hold more): streams waiting at it wake.  Cheap, callable from any thread; a no-op while
        no connection is capped.  Persistence advances need no call (the flusher reports them)."""
        self.ceilings.advanced(partition)

    def set_ceiling_provider(self, visibility: Visibility, provider: CeilingProvider | None) -> None:
        """Install the ceiling of ``visibility`` after start-up (a node joining a cluster);
        connections that say hello afterwards use it."""
        self.ceilings.set_provider(visibility, provider)

    async def close(self) -> None:
        """Engine closing: every connection ends its streams (``shutting_down``), then the hub
        stops listening to the engine."""
        try:
            await self.streams.shutdown()
        finally:
            self.hub.close()
            self.ceilings.close()
