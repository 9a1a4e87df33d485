"""One stream connection: the thin asyncio adapter between a WebSocket and ``ServerSession``.

Theory of operation
-------------------
Every protocol decision (message validation, order, rollback checks, which stream to visit next,
positions, bounded-stream ends, barrier cookies, flow-control accounting, cycle_complete) is made
by the sans-I/O ``engine.protocol.session.ServerSession``.  This class only carries out what the
session returns and feeds it what happened, with two tasks on the event loop:

* the **reader** receives WebSocket messages and feeds them to the session; it answers the
  session's engine lookups (``LookupPartitions``, ``LookupStream``) with reads in executor
  threads, queues the messages the session returns for the sender, and wakes it.  It never waits
  for the consumer, so acks, cookies and WebSocket pongs keep flowing while the sender is blocked.
* the **sender** owns the socket's outgoing side (through the ``Outbox``, outbox.py, which
  counts every frame against the window and bundles for clients that accept bundles): queued
  control messages first, then the session's stream loop (``PassSender``, passes.py):
  ``begin_visits`` (the due streams of the pass) -> snapshot and encode in executor threads
  (``PartitionCursor.produce``, at most ``chunk_bytes`` of encoded output at a time) -> send
  marker and batch frames, each only while ``session.can_send`` -> ``end_visit``.  A pass that
  needs only a few items still in the write queue's memory is produced on the loop instead
  (``Engine.memory_snapshot``: no LMDB call, no thread hop, which dominate a live tail's latency).
  With nothing to do it sleeps on one ``asyncio.Event`` set by engine notifications
  (``ChangeHub``), client messages and shutdown: no busy loop.

A ``persisted`` or ``majority`` consumer (hello ``visibility``) is *capped*: its connection takes
the ceiling provider of that visibility (``VisibleCeilings``, ceilings.py), the cursors cut each
reading at the ceiling (read right after the snapshot), ``end_visit`` reports what was held
back, and ceiling advances (flusher rounds, the node's majority reports) reach the session as
``visible_ceiling`` and wake the sender.  Capped passes are never produced inline (the memory
they would send is above a persisted ceiling).  An uncapped connection runs none of this.

Bounded memory for slow consumers: encoded output is capped by the chunk budget, unacknowledged
bytes by the window, the socket buffer by uvicorn's write flow control (a send waits until the
transport drains).  Once the sender has waited ``drop_after_s`` for the consumer (the socket does not
take a frame, or the window is full), every snapshot the connection holds is released (cursor
dropping: no LMDB read transaction or write-queue root stays pinned by a stalled consumer) and
re-read, from disk, when the consumer moves again.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.websockets import WebSocketDisconnect

from app import events
from app.stream.ceilings import VisibleCeilings
from app.stream.cursor import PartitionCursor
from app.stream.hub import ChangeHub
from app.stream.outbox import Outbox
from app.stream.passes import PassSender
from app.stream.rawframes import RawFrames
from app.streams_registry import ConnectionStatus, PartitionStreamStatus
from engine.protocol import messages as M
from engine.protocol.errors import CloseCode
from engine.protocol.session import REPLICATION_PREFIX, Close, LookupPartitions, LookupStream, ServerSession

log = logging.getLogger("upr.stream")

__all__ = ["ReplicaAckSink", "StreamConnection", "StreamLimits"]


class ReplicaAckSink(Protocol):
    """Where a replication connection's ``seqno_ack``s go (``app.cluster.durable.DurableWrites``):
    handed the session after each message received, and told when the connection ends."""

    def acked(self, conn: object, session: ServerSession) -> None: ...

    def closed(self, conn: object, session: ServerSession) -> None: ...


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """The adapter's limits (the protocol's own are ``protocol``); explicit and configurable
    through ``app.state.stream_limits``."""

    protocol: M.ProtocolLimits = field(default_factory=M.ProtocolLimits)
    #: encoded output produced per executor job: bounds server memory per connection
    chunk_bytes: int = 256 * 1024
    #: item batch frame target size and item count
    frame_bytes: int = 64 * 1024
    #: largest bundle (several messages in one WebSocket message, for clients that accept them)
    bundle_bytes: int = 64 * 1024
    frame_items: int = 4096
    #: most stream visits begun together and produced in one reader-thread job
    max_visits_per_job: int = 64
    #: the sender yields to the event loop after this many visits of a pass (fairness to HTTP
    #: requests and other connections; sends alone seldom suspend)
    visits_per_yield: int = 8
    #: the pending bundle goes out before a yield or a reader-thread hop in the middle of a pass
    #: only once it holds this many bytes (the pass's end, control messages and waiting for
    #: credit always send it).  WHY: under fan-out, lagging consumers' passes hop to a reader
    #: thread per visit once the chunk budget is used, and flushing before each hop sent
    #: ~4.6 messages per pass of ~10 KB; each message is a socket write (the largest single cost
    #: on the loop, profiled), and frames already behind gain nothing from leaving one hop earlier
    mid_pass_flush_bytes: int = 32 * 1024
    #: a pass whose visits need only the write queue's memory, at most this many items in all, is
    #: produced on the event loop instead of a reader thread (``Engine.memory_snapshot``); 0 turns that off
    inline_items: int = 256
    #: passes of consumers at the same positions send the same encoded readings, read and encoded
    #: once per partition change (``app.stream.shared``; bundling clients, uncapped streams,
    #: readings of at most ``inline_items`` from memory); False: every connection produces its own
    shared_passes: bool = True
    #: release a pinned snapshot when the consumer made no progress for this long
    drop_after_s: float = 2.0
    #: how long a closing connection may take to flush its last messages
    close_timeout_s: float = 5.0
    #: replies queued for a client that does not read them; past this the reader stops reading
    #: (backpressure) until they drain, so a client flooding requests cannot grow server memory
    max_queued_replies: int = 1024
    #: open stream connections per server; more are refused (503) before the upgrade
    max_connections: int = 1000
    #: open stream connections per bearer token (per address when auth is off); more get 429
    max_connections_per_client: int = 100
    #: a connection that sends no hello this long is closed (error hello_timeout, 1008): an idle
    #: socket holds a slot, and client libraries answer pings, so ping timeouts never end it
    hello_timeout_s: float = 10.0


class StreamConnection(PassSender):
    """Drives one accepted WebSocket; ``run`` returns when the connection is over."""

    def __init__(
        self,
        ws: Any,
        *,
        engine: Any,
        read: Callable[..., Awaitable[Any]],
        hub: ChangeHub,
        limits: StreamLimits,
        remote: str,
        on_rollback: Callable[[str], None] = lambda reason: None,
        on_bytes: Callable[[int], None] = lambda n: None,
        on_delivery: Callable[[float], None] = lambda seconds: None,
        on_cursor_drop: Callable[[], None] = lambda: None,
        owner_of: Callable[[int], dict[str, Any]] | None = None,
        ceilings: VisibleCeilings | None = None,
        replica_acks: ReplicaAckSink | None = None,
        may_replicate: bool = True,
    ) -> None:
        self.ws = ws
        self._ceilings = ceilings
        #: the visible ceiling of this connection's partitions (None: not capped), set at hello
        self._ceiling_of: Callable[[int], int] | None = None
        self._owner_of = owner_of
        self._replica_acks = replica_acks
        self.engine = engine
        self._read = read
        self.hub = hub
        self.limits = limits
        self.remote = remote
        self._on_rollback = on_rollback
        self._on_cursor_drop = on_cursor_drop
        #: partition -> when the first not yet delivered change notification arrived (loop time)
        self._notified_at: dict[int, float] = {}
        #: the same for the partitions being visited: a visit's reading covers every notification
        #: that came before it began, so those are delivered by its first batch or (nothing new:
        #: an earlier visit already sent the change) need no delivery at all
        self._visit_notified: dict[int, float] = {}
        self.session = ServerSession(node_id=engine.node_id, partition_count=engine.num_partitions,
                                     limits=limits.protocol, may_replicate=may_replicate)
        self.cursors: dict[int, PartitionCursor] = {}
        self.connected_at = time.time()
        self.cursor_drops = 0
        self.rollbacks = 0
        self._wake = asyncio.Event()
        self._close: Close | None = None
        self._peer_closed = False
        self._done = asyncio.Event()
        self._stopped = False
        self._visiting: int | None = None
        self._parked = False
        self._begun: list[Any] | None = None
        #: a failure of ``_direct_pass``, raised by the sender task
        self._failed: Exception | None = None
        self._visiting_cursor: PartitionCursor | None = None
        self._job: asyncio.Future[Any] | None = None
        self._cursor_lock = asyncio.Lock()  # one reader-thread job per connection at a time
        #: when the sender began waiting for window credit (None: not waiting); with the
        #: outbox's send in progress, how long the sender has waited for the consumer, on which
        #: cursor dropping keys
        self._credit_wait_since: float | None = None
        self.inline_passes = 0  # passes produced on the loop from memory (Engine.memory_snapshot)
        self.shared_sent = 0  # passes sent from shared readings (app.stream.shared)
        self.direct_passes = 0  # of those, carried out on the hub's delivery (``_direct_pass``)
        self.packed_passes = 0  # of those, sent as one packed pass (hello ``frames: packed``)
        self.visits_now = 0  # visits carried out without suspending (``_send_visit_now``)
        self.sender_wakeups = 0  # times the parked sender task was woken (for benchmarks)
        #: everything sent goes through the outbox (control replies queued by the reader, the
        #: sender's markers and batches, bundling when the client accepts bundles)
        self.outbox = Outbox(ws, self.session, bundle_bytes=limits.bundle_bytes, on_bytes=on_bytes,
                             on_delivery=on_delivery, raw=RawFrames.of(getattr(ws, "scope", {})))

    @property
    def name(self) -> str:
        return self.session.hello.name if self.session.hello else ""

    @property
    def codec(self) -> str:
        return self.session.hello.codec.value if self.session.hello else M.Codec.JSON.value

    # ------------------------------------------------------------------ hub subscriber
    def notified_at(self) -> dict[int, float]:
        """Partition -> when its oldest undelivered change was announced (loop time): what a
        stream's lag in seconds is measured from (the console's Streams page)."""
        return dict(self._notified_at)

    def notify(self, partitions: frozenset[int]) -> None:
        """Engine changes (writes, state changes) on ``partitions``.  The state is read here, on
        the loop (one attribute read), so a stream of a partition that left its state ends at
        once instead of after the snapshot it is in and the rest of the pass."""
        session = self.session
        streams = session.streams
        now = time.monotonic()
        hit = False
        for p in partitions:
            stream = streams.get(p)
            if stream is None:
                continue
            state = self.engine.state(p).value
            if state != stream.expected_state:
                log.info("stream %s: partition %d is now %s; stream ended", self.name, p, state)
                self._carry_out(session.state_changed(p, state))
                continue
            session.notify(p)
            self._notified_at.setdefault(p, now)
            hit = True
        if hit and not self._direct_pass_or_fail():
            self._wake.set()

    def _direct_pass_or_fail(self) -> bool:
        """``_direct_pass``, its failure handed to the sender task: it runs inside the hub's
        delivery, which must go on to the other subscribers; the sender raises it and the
        connection ends as after any failure of its own (logged, closed 1011)."""
        try:
            return self._direct_pass()
        except Exception as exc:  # noqa: BLE001 - re-raised by the sender task
            self._failed = exc
            return False

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        self.hub.subscribe(self)
        sender = asyncio.create_task(self._send_loop(), name=f"stream-send-{self.remote}")
        reader = asyncio.create_task(self._read_loop(), name=f"stream-read-{self.remote}")
        watchdog = asyncio.create_task(self._watchdog(), name=f"stream-watchdog-{self.remote}")
        hello_deadline = asyncio.get_running_loop().call_later(self.limits.hello_timeout_s, self._hello_overdue)
        try:
            await asyncio.wait({sender, reader}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and not sender.done() and not self._peer_closed:
                # the reader stopped on a protocol error: let the sender flush the error and close
                try:
                    async with asyncio.timeout(self.limits.close_timeout_s):
                        await asyncio.shield(sender)
                except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - reported below
                    pass
            for task in (sender, reader):
                if task.done() and not task.cancelled():
                    exc = task.exception()
                    if exc is not None and not isinstance(exc, (WebSocketDisconnect, ConnectionError, OSError)):
                        log.error("stream %s (%s) failed", self.name or "?", self.remote, exc_info=exc)
                        await self._close_socket(1011, "internal error")
        finally:
            self._stopped = True
            self.hub.unsubscribe(self)
            if self._ceiling_of is not None and self._ceilings is not None:
                self._ceilings.unsubscribe(self)
            if self._replica_acks is not None:
                self._replica_acks.closed(self, self.session)
            hello_deadline.cancel()
            watchdog.cancel()
            for task in (sender, reader):
                task.cancel()
            for task in (sender, reader):
                try:
                    await task
                except BaseException:  # noqa: BLE001 - cancelled or already reported
                    pass
            await self._release_all()
            self._done.set()

    def _hello_overdue(self) -> None:
        outs = self.session.hello_timeout(self.limits.hello_timeout_s)
        if outs:
            log.info("stream (%s): no hello within %g s; closing", self.remote, self.limits.hello_timeout_s)
            self._carry_out(outs)

    async def shutdown(self) -> None:
        """Server stopping: ``stream_end(shutting_down)`` for every stream, then close 1001."""
        if self._stopped:
            return
        self._carry_out(self.session.shutdown())
        try:
            async with asyncio.timeout(self.limits.close_timeout_s):
                await self._done.wait()
        except asyncio.TimeoutError:
            await self._close_socket(int(CloseCode.GOING_AWAY), "server shutting down")

    async def _on_reader(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a cursor operation on a reader thread.  Shielded: if this task is cancelled the
        job still finishes before anything else touches the cursor (``_release_all`` waits)."""
        async with self._cursor_lock:
            job = self.hub.jobs.run(fn, *args) if self.hub.jobs is not None else asyncio.ensure_future(
                self._read(fn, *args))
            self._job = job
            return await asyncio.shield(job)

    async def _release_all(self) -> None:
        if self._job is not None and not self._job.done():
            try:
                async with asyncio.timeout(30):
                    await asyncio.shield(self._job)
            except BaseException:  # noqa: BLE001 - the job's own errors do not matter any more
                pass
        cursors = list(self.cursors.values())
        self.cursors.clear()
        if cursors:
            try:
                await self._read(_close_cursors, cursors)
            except Exception:  # noqa: BLE001 - executor gone at shutdown: drop references instead
                _close_cursors(cursors)

    async def _close_socket(self, code: int, reason: str) -> None:
        try:
            async with asyncio.timeout(2.0):
                await self.ws.close(code, reason)
        except Exception:  # noqa: BLE001 - already closed or peer gone
            pass

    # ------------------------------------------------------------------ reader
    async def _read_loop(self) -> None:
        session = self.session
        while True:
            while self.outbox.queued > self.limits.max_queued_replies:
                await self.outbox.wait_drained()
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                self._peer_closed = True
                self._wake.set()
                return
            text = message.get("text")
            outs = session.receive_text(text) if text is not None else session.receive_binary(message["bytes"])
            await self._resolve(outs)
            if self._replica_acks is not None:
                self._replica_acks.acked(self, session)
            self._wake_after_input()
            if self._close is not None:
                return

    def _wake_after_input(self) -> None:
        """Wake the sender for what a client message may have made possible (an ack opening the
        window, a request, a cookie).  A parked sender with nothing due stays asleep.  WHY:
        consumers acknowledge every few messages, and under fan-out waking every connection's
        sender task for each ack, only for it to find nothing to do, was a task step per ack."""
        if (not self._parked or self.outbox.queued or self._close is not None or self._peer_closed
                or self.session.next_visit() is not None):
            self._wake.set()

    async def _resolve(self, outs: list[Any]) -> None:
        """Carry out session outputs, answering engine lookups as they come.

        The lookups (``_partition_infos``) are answered here on the loop: each is a few attribute
        reads of a partition's memory (its queue root, state and failover log; no LMDB), as the
        hub's ``notify`` and the shared readings read them.  WHY not a reader-thread hop: the
        requests of a connection are answered one at a time, so a consumer opening 32 streams
        waited 32 hops behind whatever the reader threads and the GIL were doing; on a node
        taking writes that was seconds before its first data (docs/benchmarks.md, "Cluster":
        the 500/s outliers)."""
        pending = deque(outs)
        while pending:
            out = pending.popleft()
            if isinstance(out, LookupPartitions):
                self._take_ceiling()
                self._take_pacing()
                infos = _partition_infos(self.engine, out.partitions)
                pending.extendleft(reversed(self.session.partitions_info(infos)))
            elif isinstance(out, LookupStream):
                info = _partition_infos(self.engine, (out.partition,))[out.partition]
                pending.extendleft(reversed(self.session.stream_info(out.partition, info)))
            else:
                self._carry_out([out])

    def _take_ceiling(self) -> None:
        """Hello accepted: a ``persisted`` or ``majority`` consumer is capped from now on."""
        hello = self.session.hello
        if hello is None or self._ceilings is None or self._ceiling_of is not None:
            return
        self._ceiling_of = self._ceilings.provider(hello.visibility)
        if self._ceiling_of is not None:
            self._ceilings.subscribe(self)

    def _take_pacing(self) -> None:
        """Hello accepted: a replication stream is woken at once, never paced (hub.py)."""
        hello = self.session.hello
        if hello is not None and hello.name.startswith(REPLICATION_PREFIX):
            self.hub.set_prompt(self)

    def ceiling_advanced(self, partitions: frozenset[int]) -> None:
        """``VisibleCeilings`` subscriber (event loop): tell the session the new ceilings; a
        stream waiting at its ceiling becomes due once it has passed the held reading."""
        ceiling_of, session = self._ceiling_of, self.session
        if ceiling_of is None:
            return
        hit = False
        for p in partitions:
            if p in session.streams:
                session.visible_ceiling(p, ceiling_of(p))
                hit = True
        if hit:
            self._wake.set()

    def _carry_out(self, outs: list[Any], wake: bool = True) -> None:
        for out in outs:
            if isinstance(out, Close):
                self._close = out
            elif isinstance(out, M.StreamResponse):
                if out.status is M.StreamStatus.NOT_MY_PARTITION and self._owner_of is not None:
                    out = self._with_owner(out)
                self._on_response(out)
                self.outbox.queue(out)
            elif isinstance(out, M.StreamEndMessage):
                self._forget(out.partition)
                self.outbox.queue(out)
            elif isinstance(out, M.Error):
                log.info("stream %s (%s): refused: %s (field %s): %s", self.name or "?", self.remote, out.code,
                         out.field, out.message)
                self.outbox.queue(out)
            else:
                self.outbox.queue(out)
        if wake:
            self._wake.set()

    def _with_owner(self, r: M.StreamResponse) -> M.StreamResponse:
        """A cluster's not_my_partition names the map revision and who serves the partition, so
        the consumer knows which map to reload and where to go."""
        where = self._owner_of(r.partition)  # type: ignore[misc]
        owner = f"node {where['active']} at {where['url']}" if where.get("url") else "no node right now"
        return dataclasses.replace(r, detail=f"{r.detail} (map revision {where['map_revision']}; served by {owner})")

    def _on_response(self, r: M.StreamResponse) -> None:
        p = r.partition
        if r.status is M.StreamStatus.OK:
            stream = self.session.streams.get(p)
            if stream is not None:
                self.cursors[p] = PartitionCursor(p, stream.position, stream.snap_start,
                                                  frame_bytes=self.limits.frame_bytes,
                                                  frame_items=self.limits.frame_items)
        elif r.status is M.StreamStatus.ROLLBACK:
            self.rollbacks += 1
            self._on_rollback(str(r.reason))
            events.rollback_answered(self.engine, self.name, self.remote, r)
            log.warning("stream %s (%s): partition %d told to roll back to %s (%s): %s", self.name, self.remote, p,
                        r.rollback_seqno, r.reason, r.detail)

    def _forget(self, partition: int) -> None:
        cursor = self.cursors.pop(partition, None)
        if cursor is not None and cursor.holding and partition != self._visiting:
            # released on a reader thread (a disk part closes an LMDB transaction), under the
            # cursor lock so never concurrently with a job on it; a cursor being sent is
            # released by its visit
            asyncio.ensure_future(self._on_reader(cursor.close))

    # ------------------------------------------------------------------ sender
    async def _send_loop(self) -> None:
        session = self.session
        while True:
            if self._failed is not None:
                raise self._failed
            await self.outbox.flush_control()
            if self._peer_closed:
                return
            if self._close is not None:
                await self._close_socket(int(self._close.code), self._close.reason)
                return
            if not self._begun:
                done = self.direct_passes
                self._direct_pass(sender=True)  # the common tail pass, from the readings' table
                if self.direct_passes != done or self._begun:
                    continue
            visits = self._take_begun() if self._begun else session.begin_visits(self.limits.max_visits_per_job)
            if visits:
                await self._visit_batch(visits)
                continue
            self._wake.clear()
            if self.outbox.queued or self._close is not None or self._peer_closed or session.next_visit() is not None:
                continue
            self._parked = True
            try:
                await self._wake.wait()
            finally:
                self._parked = False
            self.sender_wakeups += 1

    async def _watchdog(self) -> None:
        """Cursor dropping: once the sender has waited ``drop_after_s`` for the consumer (a send
        the socket does not take, or a full window: whatever window it asked for), release every
        snapshot this connection pins, not only the one being sent: a pass produces several
        visits in one job, so the stalled send may belong to a visit whose snapshot is already
        released while a later visit of the same job still holds an LMDB read transaction (which
        keeps every page written since from being reused: the data file grows at the write rate)
        or a write-queue root.  Each stream re-reads after its last encoded seqno when the
        consumer moves again (a continuation snapshot, as DCP's backfill after a dropped cursor)."""
        period = self.limits.drop_after_s / 4
        while True:
            await asyncio.sleep(period)
            if self._ceiling_of is not None:
                await self._release_stale_held()
            since = self._waiting_since()
            if since is None or time.monotonic() - since < self.limits.drop_after_s:
                continue
            held = [c for c in {*self.cursors.values(), self._visiting_cursor} if c is not None and c.holding]
            if not held:
                continue
            dropped = await self._on_reader(_drop_cursors, held)
            if not dropped:
                continue
            self.cursor_drops += len(dropped)
            for _ in dropped:
                self._on_cursor_drop()
            log.info("stream %s (%s): consumer stalled for %.1f s, released the snapshots of partition(s) %s "
                     "(re-read from disk when it moves again)", self.name or "?", self.remote,
                     time.monotonic() - since, ", ".join(f"{c.partition}@{c.last_seqno}" for c in dropped))

    async def _release_stale_held(self) -> None:
        """A capped stream pins the reading whose parts wait for the ceiling; one that waited
        ``drop_after_s`` (replicas gone, a stalled flusher) is released, as a stalled consumer's
        would be, and read afresh once the ceiling moves."""
        limit = time.monotonic() - self.limits.drop_after_s
        stale = [c for c in self.cursors.values()
                 if c.held_since is not None and c.held_since < limit and c is not self._visiting_cursor]
        if stale:
            released = await self._on_reader(_release_held, stale)
            if released:
                log.info("stream %s (%s): released the readings of partition(s) %s, held %.1f s for the "
                         "visible ceiling", self.name or "?", self.remote,
                         ", ".join(str(c.partition) for c in released), self.limits.drop_after_s)

    # ------------------------------------------------------------------ registry handle
    def to_status(self) -> ConnectionStatus:
        parts = []
        for p, stream in sorted(self.session.streams.items()):
            cursor = self.cursors.get(p)
            high = max(cursor.high_seqno if cursor else 0, stream.position)
            purge = max(stream.purge_seqno, cursor.purge_seqno if cursor else 0)
            parts.append(PartitionStreamStatus(partition=p, last_sent_seqno=stream.position,
                                               lag=high - stream.position, purge_seqno=purge,
                                               purge_distance=stream.position - purge))
        flow = self.session.flow
        return ConnectionStatus(
            name=self.name, remote=self.remote, codec=self.codec, partitions=parts,
            bytes_buffered=flow.in_flight if flow else 0, barriers_pending=len(self.session.pending_cookies),
            connected_at=self.connected_at, window_bytes=flow.window if flow else 0,
            cursor_drops=self.cursor_drops, rollbacks=self.rollbacks,
        )


def _partition_infos(engine: Any, partitions: tuple[int, ...]) -> dict[int, M.PartitionInfo]:
    out = {}
    for p in partitions:
        s = engine.stats(p)
        out[p] = M.PartitionInfo(state=s.state, high_seqno=s.high_seqno, purge_seqno=s.purge_seqno,
                                 log=tuple(s.failover_log))
    return out


def _drop_cursors(cursors: list[PartitionCursor]) -> list[PartitionCursor]:
    """Reader thread: release each cursor's snapshot; the ones that held one."""
    return [cursor for cursor in cursors if cursor.drop()]


def _release_held(cursors: list[PartitionCursor]) -> list[PartitionCursor]:
    """Reader thread: release each cursor's reading pinned for the ceiling; the ones released."""
    return [cursor for cursor in cursors if cursor.release_held()]


def _close_cursors(cursors: list[PartitionCursor]) -> None:
    for cursor in cursors:
        cursor.close()
