"""Replication streams: this node's replica copies, fed by their actives over the stream protocol.

A replica is a client of its active like any consumer (UPR's replica rules, notes/cluster.md
§1): one WebSocket to the active node's ``/stream`` per active node, hello name
``replication:<this node>`` (``GET /streams`` shows such connections as replication), one
stream per partition it replicates from there.  What the answers mean is the pure
``ClientSession``'s business; this adapter only moves bytes and carries out its actions against
the engine:

===========================  ================================================================
session says                 done here
===========================  ================================================================
stream ``ok`` + failover log ``Engine.adopt_failover_log``: the copy's history is the active's
snapshot marker, item batch  ``Engine.apply_replica_run``, a received run at a time (the active's
                             seqno, CAS, rev and deletions); a whole snapshot moves the
                             copy's progress (``engine.cluster.replica_sync``)
rollback (``Repair``)        ``Engine.undo_replica``: the copy cuts its history back to the
                             rollback seqno, restoring each key's version there, and streams on
                             from it; when that cannot be exact (a version it needs is gone,
                             the undo is over its limit: ``engine.cluster.replica_rollback``),
                             ``Engine.reset_partition`` and stream from 0 (counted: ``undos``,
                             ``resets``)
reconnect, connection lost   a new connection after a capped backoff, resuming from what the
                             engine holds (its high seqno and snapshot range), never from
                             what the previous connection had received
===========================  ================================================================

Every connection starts a fresh ``ClientSession`` whose offsets come from the engine, so the
position streamed from is always what the copy really holds.

What the copy holds goes back to the active as ``seqno_ack {partition, received, persisted}``
(``ReplicaAcker``): the ends of the last whole snapshots held in memory and on disk
(``Engine.replica_held``), which durable writes and ``GET /cluster`` lag on the active count.
Acks are coalesced: one per partition whose figures moved since the last one, sent after the
batches applied so far, all of them in one bundle; the flusher's progress wakes the acker through
the engine's persist listener (once per flush round that persisted one of its partitions), so
it reaches the active without an ack per item and without the acker polling while writes flow.  Progress (last whole snapshot end,
in sync) goes to etcd under the node's lease, looked at every ``publish_interval_s``: a change of
in sync, a lost stream, or a seqno that stayed put ``publish_settle_s``, at once; a seqno that
keeps moving at most every ``publish_max_age_s`` (``app.cluster.progress_pacing``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.cluster.etcd import Delete, EtcdClient, EtcdError, Put
from app.cluster.lag_trace import ReplicationTrace
from app.cluster.layout import Layout
from app.cluster.progress_pacing import PublishPacer
from clients.connection import ReconnectNeeded, StreamConnection, stream_url
from engine.cluster.replica_rollback import Resync, Undo, resume_uuid
from engine.cluster.replica_sync import Progress, ReplicaSync
from engine.core.errors import UprError
from engine.engine import Engine
from engine.protocol import messages as M
from engine.protocol.bundle import encode_bundle
from engine.protocol.client.actions import (
    Deliver,
    Reconnect,
    Repair,
    RollbackPlan,
    RollbackPolicy,
    Send,
    StreamEnded,
)
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.session import ClientSession
from engine.protocol.frames import ItemBatch
from engine.protocol.packed import PackedPass
from engine.protocol.session import REPLICATION_PREFIX
from engine.replica import ItemsStep, MarkerStep

log = logging.getLogger("upr.cluster")

#: how often a copy whose seqno keeps moving publishes it to etcd at most (``PublishPacer``).
#: WHY this seldom: nothing that decides reads a moving figure (a promotion or a handover reads
#: the copy once its seqno stopped, published within ``publish_settle_s``; a change of in sync
#: goes out on the next tick; ``GET /cluster`` lags come from the acks on the active), and each
#: transaction costs this node an HTTP round trip and every node's watch an event
#: (docs/benchmarks.md, "Cluster": a replicating node's CPU per bulk, thread by thread)
PUBLISH_MAX_AGE_S = 5.0

#: operations per progress transaction (etcd refuses more than ``--max-txn-ops``, 128 by default)
PUBLISH_OPS = 64


#: ``messages`` here makes replication streams ask for one message per marker and batch (the
#: benchmarks compare both on one tree); anything else, or unset: packed passes
FRAMES_ENV = "UPR_REPLICATION_FRAMES"

#: ``seqno_ack``s per WebSocket message at most (a bundle of them: well under any frame limit)
ACKS_PER_MESSAGE = 256

#: items applied per engine call (one writer lock hold) at most, give or take one batch
RUN_ITEMS = 1024

#: items a received run may carry to be applied on the event loop (when the engine's locks are
#: free): a steady stream's runs are a few batches of a few items, where the thread hop cost
#: more than the apply; a catch-up's large runs go to a thread, off the loop
INLINE_ITEMS = 256

#: how long an acker trusts the persist listener alone while a held seqno is not yet persisted
ACK_SAFETY_S = 1.0


def replication_name(node: str) -> str:
    return REPLICATION_PREFIX + node


def is_replication(hello_name: str) -> bool:
    return hello_name.startswith(REPLICATION_PREFIX)


class ReplicationStreams:
    """The replica copies this node holds and the streams that feed them."""

    def __init__(self, engine: Engine, node: str, etcd: EtcdClient, layout: Layout, lease: Callable[[], int], *,
                 publish_interval_s: float = 0.2, publish_max_age_s: float = PUBLISH_MAX_AGE_S,
                 publish_settle_s: float = 0.6, open_timeout_s: float = 5.0, max_backoff_s: float = 2.0,
                 max_frame_bytes: int = 64 << 20, max_down_s: float = 10.0,
                 is_live: Callable[[str], bool] = lambda node: True, ack_poll_s: float | None = None,
                 token: str | None = None, ack_at_once: Callable[[int], bool] | None = None,
                 packed: bool | None = None) -> None:
        self.engine, self.node, self.etcd, self.layout, self.lease = engine, node, etcd, layout, lease
        #: ask actives for packed passes (hello ``frames: packed``): a pass's markers and
        #: batches in one part, decoded in one call and taken without a message each
        self.packed = packed if packed is not None else os.environ.get(FRAMES_ENV, "packed") != "messages"
        #: whether a partition's acks skip the take's gathering (``ReplicaAcker``): a handover's
        #: target, whose source's write pause waits for them
        self.ack_at_once = ack_at_once
        #: bearer token for the actives' stream endpoints (admin role when they check tokens)
        self.token = token
        self.publish_interval_s = publish_interval_s
        self.open_timeout_s = open_timeout_s
        self.max_backoff_s = max_backoff_s
        self.max_frame_bytes = max_frame_bytes
        #: cut off this long from a live active, a copy is no longer in sync (``ReplicaSync.tick``)
        self.max_down_s = max_down_s
        self.is_live = is_live
        #: how long an acker waits for the flusher's word while something held is not persisted,
        #: before it looks by itself (a safety net: the persist listener wakes it)
        self.ack_poll_s = ack_poll_s if ack_poll_s is not None else ACK_SAFETY_S
        #: partition -> the active node it streams from
        self._source_of: dict[int, str] = {}
        #: partition -> its copy's catch-up state
        self.syncs: dict[int, ReplicaSync] = {}
        #: (active node, url) -> (its partitions, the task streaming them)
        self._streams: dict[tuple[str, str], tuple[frozenset[int], asyncio.Task[None]]] = {}
        self._gone: set[int] = set()
        self._publisher: asyncio.Task[None] | None = None
        #: which changed progress is worth an etcd write this tick (``app.cluster.progress_pacing``)
        self._pacer = PublishPacer(publish_max_age_s, publish_settle_s)
        #: rollbacks answered by undo, and by a reset (a resync from 0)
        self.undos = 0
        self.resets = 0
        #: received runs applied on the event loop, and on a worker thread (locks busy, or a large run)
        self.inline = 0
        self.hops = 0
        #: etcd transactions that published progress
        self.progress_txns = 0
        #: the replication path's wake-ups and messages, over every connection (``/metrics``)
        self.counts = ReplicationCounts()
        #: the lag benchmark's stamps (``app.cluster.lag_trace``), None unless asked for
        self.trace = ReplicationTrace.from_env()

    # ------------------------------------------------------------------ what to replicate
    def update(self, sources: Mapping[int, tuple[str, str]]) -> None:
        """Replicate exactly ``sources`` (partition -> (active node, its URL)) from now on; streams
        whose partition set is unchanged keep running."""
        wanted: dict[tuple[str, str], set[int]] = {}
        self._source_of = {p: source[0] for p, source in sources.items()}
        for p, source in sources.items():
            wanted.setdefault(source, set()).add(p)
        for source, (parts, task) in list(self._streams.items()):
            if frozenset(wanted.get(source, ())) != parts:
                task.cancel()
                del self._streams[source]
        for p in list(self.syncs):
            if p not in sources:
                del self.syncs[p]
                self._gone.add(p)
        for p in sources:
            if p not in self.syncs:
                _high, mark = self.engine.replica_mark(p)
                self.syncs[p] = ReplicaSync(mark.complete_end)  # catching up until a handshake says otherwise
                self._gone.discard(p)
        for source, parts in wanted.items():
            if source not in self._streams:
                frozen = frozenset(parts)
                task = asyncio.create_task(self._run(source[0], source[1], frozen),
                                           name=f"replication of {sorted(frozen)} from {source[0]}")
                self._streams[source] = (frozen, task)
        if self._publisher is None:
            self._publisher = asyncio.create_task(self._publish_loop(), name="replica progress")

    def progress(self, partition: int) -> Progress | None:
        sync = self.syncs.get(partition)
        return sync.progress if sync is not None else None

    async def aclose(self) -> None:
        tasks = [task for _parts, task in self._streams.values()]
        if self._publisher is not None:
            tasks.append(self._publisher)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._streams.clear()
        self._publisher = None

    # ------------------------------------------------------------------ progress
    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.publish_interval_s)
            try:
                await self.publish_once()
            except EtcdError as exc:
                log.warning("node %s: publishing replica progress failed (retrying): %s", self.node, exc)

    async def publish_once(self) -> None:
        """Withdraw the progress of copies gone, publish the progress that changed: in etcd
        transactions of at most ``PUBLISH_OPS`` operations, not one request per copy.  WHY:
        under writes every copy's progress moves every round, and each request costs this
        node's loop an HTTP round trip and every node's watcher a wake-up (bench/cluster_lag.py
        profiles showed the control plane as the nodes' largest CPU user)."""
        ops: list[Put | Delete] = []
        gone = sorted(self._gone)
        ops += [Delete(self.layout.replica_progress(p, self.node)) for p in gone]
        lease = self.lease()
        now = asyncio.get_running_loop().time()
        changed: list[tuple[int, ReplicaSync, Progress]] = []
        pacer = self._pacer
        for p in gone:
            pacer.forget(p)
        waiting: list[tuple[int, ReplicaSync, Progress]] = []
        for p, sync in list(self.syncs.items()):
            source = self._source_of.get(p)
            sync.tick(now, source is not None and self.is_live(source), self.max_down_s)
            progress = sync.changed()
            if progress is None:
                continue
            if pacer.due(p, now, progress, stream_lost=sync.down_since is not None):
                changed.append((p, sync, progress))
            else:
                waiting.append((p, sync, progress))
        if ops or changed:  # a transaction goes out anyway: moving copies near their age ride along
            changed += [(p, sync, progress) for p, sync, progress in waiting
                        if pacer.due(p, now, progress, riding=True)]
        ops += [Put(self.layout.replica_progress(p, self.node), json.dumps(progress.to_json()).encode(), lease)
                for p, _sync, progress in changed]
        for i in range(0, len(ops), PUBLISH_OPS):
            await self.etcd.txn((), ops[i:i + PUBLISH_OPS])
            self.progress_txns += 1
        self._gone.difference_update(gone)
        for p, sync, progress in changed:
            sync.published(progress)
            pacer.published(p, now, progress)

    # ------------------------------------------------------------------ streams
    async def _run(self, active: str, url: str, partitions: frozenset[int]) -> None:
        delay = 0.05
        while True:
            try:
                await self._connection(active, url, partitions)
                delay = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure of one connection means "retry"
                log.info("node %s: replication of partitions %s from node %s (%s) stopped: %s; retrying in %.2fs",
                         self.node, _ranges(partitions), active, url, exc or type(exc).__name__, delay)
            now = asyncio.get_running_loop().time()
            for p in partitions:
                sync = self.syncs.get(p)
                if sync is not None:
                    sync.stream_lost(now)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)

    def _offset(self, p: int) -> StreamOffset:
        high, mark = self.engine.replica_mark(p)
        uuid = resume_uuid(self.engine.failover_log(p), high)
        return StreamOffset(uuid, high, mark.snap_start, mark.snap_end) if uuid else StreamOffset.beginning()

    async def _connection(self, active: str, url: str, partitions: frozenset[int]) -> None:
        engine = self.engine
        acker = ReplicaAcker(engine, self.ack_poll_s, self.counts, at_once=self.ack_at_once)
        offsets = {}
        for p in sorted(partitions):
            offset = self._offset(p)
            if offset.uuid == 0 and engine.high_seqno(p) > 0:
                # data without a history: nothing the active could check it against
                await asyncio.to_thread(engine.reset_partition, p)
            offsets[p] = offset
        session = ClientSession(partitions=sorted(partitions), offsets=offsets, on_rollback=RollbackPolicy.REPORT)
        conn = await StreamConnection.open(stream_url(url), self.token, open_timeout=self.open_timeout_s,
                                           max_frame_bytes=self.max_frame_bytes, ping_interval=None,
                                           unpack=False)
        acks = asyncio.create_task(acker.run(conn), name=f"replica acks to {active}")
        try:
            # bundles: several messages per frame, applied with one thread hop (``_apply_run``);
            # packed passes: a pass's markers and batches in one part, decoded and taken at once
            await conn.send(session.hello(replication_name(self.node), M.Codec.BINARY, bundle=True,
                                          frames=M.Frames.PACKED if self.packed else M.Frames.MESSAGES))
            first, nbytes = await conn.first(self.open_timeout_s)
            if isinstance(first, M.FailoverLogs):
                for p in partitions:
                    info = first.partitions.get(p)
                    sync = self.syncs.get(p)
                    if info is not None and sync is not None:
                        sync.requested(info.high_seqno, engine.replica_mark(p)[1].complete_end)
            await self._carry_out(conn, session, session.receive_handshake(first, nbytes))
            log.info("node %s: replicating partitions %s from node %s", self.node, _ranges(partitions), active)
            trace = self.trace
            inbox = Inbox(stamped=trace is not None, counts=self.counts)
            reader = asyncio.create_task(inbox.fill(conn), name=f"replication from {active}: receive")
            try:
                while True:
                    received = await inbox.take_all()
                    acker.begin_take()
                    try:
                        if trace is None:
                            await self._process(conn, session, acker, received)
                        else:
                            arrived, taken = inbox.taken_arrivals, time.monotonic()
                            await self._process(conn, session, acker, received)
                            trace.record(received, arrived, taken, time.monotonic())
                    finally:
                        acker.end_take()
                    if acks.done():
                        acks.result()  # the acker's failure (a closed connection) ends this one
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
        finally:
            acks.cancel()
            await asyncio.gather(acks, return_exceptions=True)
            await conn.close()

    async def _process(self, conn: StreamConnection, session: ClientSession, acker: ReplicaAcker,
                       received: list[tuple[Any, int]]) -> None:
        """Everything received since the last call, in order: runs of markers and batches are
        applied together (``_apply_run``), any other message between them on its own."""
        engine = self.engine
        run: list[tuple[Any, int]] = []
        for msg, nbytes in received:
            if type(msg) is ItemBatch or type(msg) is PackedPass or isinstance(msg, M.SnapshotMarker):
                run.append((msg, nbytes))
                continue
            await self._apply_run(conn, session, acker, run)
            run = []
            if isinstance(msg, M.StreamResponse) and msg.status is M.StreamStatus.OK:
                await asyncio.to_thread(engine.adopt_failover_log, msg.partition, msg.failover_log or ())
                # a new connection speaks for the copy only once it acks: say at once what is
                # held, not only after the next snapshot (there may be none)
                acker.applied(msg.partition)
            await self._carry_out(conn, session, session.receive(msg))
            await self._processed(conn, session, nbytes)
        await self._apply_run(conn, session, acker, run)

    async def _processed(self, conn: StreamConnection, session: ClientSession, nbytes: int) -> None:
        ack = session.processed(nbytes)
        if ack is not None:
            self.counts.flow_acks += 1
            await conn.send(ack)

    async def _apply_run(self, conn: StreamConnection, session: ClientSession, acker: ReplicaAcker,
                         run: list[tuple[Any, int]]) -> None:
        """Markers and batches that arrived together, applied with one thread hop: a hop per
        message, or per WebSocket message, cannot keep up with a busy active (bench/cluster_lag.py).  The session sees
        each message in order and positions move with it; what reads the engine (snapshot
        syncs, acks) and the flow-control acks come after the engine holds them all."""
        if not run:
            return
        pending: list[Any] = []
        whole: list[int] = []
        for msg, _nbytes in run:
            if type(msg) is PackedPass:
                # the session's part of each section's marker and batch, without the messages
                self.counts.packed_passes += 1
                self.counts.packed_sections += len(msg.sections)
                moved = self._moved
                for p, marker, batch in msg.sections:
                    session.section_arrived(p, marker)
                    if marker is not None:
                        pending.append(MarkerStep(p, marker[0], marker[1]))
                    pending.append(batch)
                    if moved(session, batch):
                        whole.append(p)
                continue
            for action in session.receive(msg):
                if type(action) is not Deliver:  # no other answer to data exists; keep its word if one comes
                    await self._apply_messages(pending, whole, acker)
                    pending, whole = [], []
                    await self._carry_out(conn, session, [action])
                    continue
                data = action.message
                pending.append(data)
                if type(data) is ItemBatch and self._moved(session, data):
                    whole.append(data.partition)
        await self._apply_messages(pending, whole, acker)
        # the run's bytes at once: flow control counts a sum, and owes at most one ack for it
        await self._processed(conn, session, sum(nbytes for _msg, nbytes in run))

    async def _apply_messages(self, messages: list[Any], whole: list[int], acker: ReplicaAcker) -> None:
        if messages:
            # counted before decoding: a large run is decoded on the worker thread, off the loop
            items = sum([len(m) for m in messages if type(m) is ItemBatch])
            steps = _steps_of(messages)[0] if items <= INLINE_ITEMS else None
            if steps is not None and self.engine.try_apply_replica_run(steps):
                self.inline += 1
            else:
                await asyncio.to_thread(_apply_all if steps is None else _apply_steps, self.engine,
                                        messages if steps is None else steps)
                self.hops += 1
        # once per partition: a run often ends several snapshots of one partition, and only
        # where the last one leaves the copy matters (``ReplicaSync.snapshot_applied`` keeps the
        # highest; the acker reads what the engine holds when it looks)
        for p in dict.fromkeys(whole):
            self._snapshot_applied(p)
            acker.applied(p)

    async def _carry_out(self, conn: StreamConnection, session: ClientSession, actions: list[Any]) -> None:
        engine = self.engine
        for action in actions:
            kind = type(action)
            if kind is Deliver:
                msg = action.message
                if type(msg) is ItemBatch:
                    await self._apply(session, msg)
                elif isinstance(msg, M.SnapshotMarker):
                    await asyncio.to_thread(engine.replica_marker, msg.partition, msg.start, msg.end)
            elif kind is Send:
                await conn.send(action.message)
            elif kind is Repair:
                await conn.send(await self._roll_back(session, action.plan))
            elif kind is Reconnect:
                raise ReconnectNeeded(action.reason)
            elif kind is StreamEnded:
                log.info("node %s: replication stream of partition %d ended: %s", self.node, action.partition,
                         action.reason)

    async def _roll_back(self, session: ClientSession, plan: RollbackPlan) -> M.StreamRequest:
        """The active says the copy is ahead of its branch: undo what the copy holds above the
        rollback seqno, or, when that cannot be exact, reset it; returns the request to stream on."""
        p = plan.partition
        try:
            outcome: Undo | Resync = (await asyncio.to_thread(self.engine.undo_replica, p, plan.seqno)).plan
        except UprError as exc:  # e.g. a rollback seqno above what the copy holds: resync, never stop
            outcome = Resync(plan.seqno, f"the undo failed: {exc}")
        sync = self.syncs.get(p)
        if isinstance(outcome, Undo):
            self.undos += 1
            log.warning("node %s: partition %d rolled back by undo to seqno %d (%s): %d version(s) above it undone, "
                        "%d key(s) restored", self.node, p, plan.seqno, plan.reason or "rollback",
                        outcome.items_above, len(outcome.restore))
            if sync is not None:
                sync.rolled_back(plan.seqno)
            return session.finish_rollback(plan)
        log.warning("node %s: partition %d must roll back to seqno %d (%s) and cannot undo it: %s; the replica copy "
                    "is reset and streams again from 0", self.node, p, plan.seqno, plan.reason or "rollback",
                    outcome.reason)
        await asyncio.to_thread(self.engine.reset_partition, p)
        self.resets += 1
        if sync is not None:
            sync.reset()
        return session.finish_rollback(replace(plan, reset=True))

    async def _apply(self, session: ClientSession, batch: ItemBatch) -> None:
        await asyncio.to_thread(_apply_all, self.engine, [batch])
        if self._moved(session, batch):
            self._snapshot_applied(batch.partition)

    @staticmethod
    def _moved(session: ClientSession, batch: ItemBatch) -> bool:
        """The session's position after ``batch``; True if it ended a snapshot."""
        position = session.positions[batch.partition]
        if len(batch):
            position.items(batch.seqnos[0], batch.seqnos[-1])
        if batch.last:
            session.snapshot_done(batch.partition)
        return batch.last

    def _snapshot_applied(self, p: int) -> None:
        """A whole snapshot of ``p`` is in the engine: its sync (catching up / in sync) moves."""
        sync = self.syncs.get(p)
        if sync is not None:
            sync.snapshot_applied(self.engine.replica_mark(p)[1].complete_end)


def _steps_of(messages: list[Any]) -> tuple[list[ItemsStep | MarkerStep], int]:
    """Received markers and batches as engine steps, in order, and how many items they carry."""
    steps: list[ItemsStep | MarkerStep] = []
    items = 0
    for msg in messages:
        if type(msg) is ItemBatch:
            batch = list(msg.items())
            steps.append(ItemsStep(msg.partition, batch, msg.last))
            items += len(batch)
        elif type(msg) is MarkerStep:  # a packed pass's marker (``_apply_run``)
            steps.append(msg)
        else:
            steps.append(MarkerStep(msg.partition, msg.start, msg.end))
    return steps, items


def _apply_all(engine: Engine, messages: list[Any]) -> None:
    """Apply replicated markers and batches in order, on a worker thread (``_apply_steps``)."""
    _apply_steps(engine, _steps_of(messages)[0])


def _apply_steps(engine: Engine, steps: list[ItemsStep | MarkerStep]) -> None:
    """Apply replicated steps in order (on a worker thread: it waits for the engine's locks and
    may read LMDB): one engine call per ``RUN_ITEMS`` items or so, so that a large take never
    holds the writer lock long against this node's own writes."""
    run: list[ItemsStep | MarkerStep] = []
    items = 0
    for step in steps:
        run.append(step)
        if type(step) is ItemsStep:
            items += len(step.items)
        if items >= RUN_ITEMS:
            engine.apply_replica_run(run)
            run, items = [], 0
    if run:
        engine.apply_replica_run(run)


@dataclass(slots=True)
class ReplicationCounts:
    """What the replica side of this node's replication did, counted for ``/metrics``: the
    replication path costs per wake-up and per message, not per write, so these are what a
    change to it moves (``bench/cluster_cpu.py`` prints them per second)."""

    #: messages received from actives (a bundle counts each of its parts)
    messages: int = 0
    #: takes from an inbox: each is one wake-up of the applier, whatever it found
    takes: int = 0
    #: ``seqno_ack``s sent, and the WebSocket messages they took
    acks: int = 0
    ack_messages: int = 0
    #: acker wake-ups that looked at the engine
    ack_looks: int = 0
    #: flusher rounds handed to the event loop by ackers (``call_soon_threadsafe``)
    persist_handoffs: int = 0
    #: flow-control ``ack``s sent (bytes processed, for the active's window)
    flow_acks: int = 0
    #: packed passes received (each one of ``messages``), and the sections (batches) they held
    packed_passes: int = 0
    packed_sections: int = 0


class Inbox:
    """What one replication connection received and nobody processed yet, in arrival order.

    A receiving task (``fill``) reads the socket while the applier works; the applier takes
    everything that arrived meanwhile in one go (``take_all``), so a busy active's many small
    messages cost one thread hop per take instead of one per message: the applier's pace is
    set by the hops it makes, not by how the active cut its sends.  Bounded by flow control:
    the active sends at most its window of bytes the replica has not acknowledged, and bytes
    are acknowledged only once applied."""

    def __init__(self, *, stamped: bool = False, counts: ReplicationCounts | None = None) -> None:
        self._counts = counts if counts is not None else ReplicationCounts()
        self._items: list[tuple[Any, int]] = []
        self._ready = asyncio.Event()
        self._failure: BaseException | None = None
        #: with ``stamped``, when each item was received (for ``ReplicationTrace``), and the
        #: stamps of the last ``take_all``
        self._arrivals: list[float] | None = [] if stamped else None
        self.taken_arrivals: list[float] = []

    async def fill(self, conn: StreamConnection) -> None:
        """Receive until the connection fails; the failure is ``take_all``'s to raise."""
        try:
            while True:
                self.put(await conn.receive())
                # the rest of a bundle is already here: no await (and no task step) per part
                while (part := conn.receive_buffered()) is not None:
                    self.put(part)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the applier, which ends the connection
            self.fail(exc)

    def put(self, received: tuple[Any, int]) -> None:
        self._counts.messages += 1
        self._items.append(received)
        if self._arrivals is not None:
            self._arrivals.append(time.monotonic())
        self._ready.set()

    def fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._ready.set()

    async def take_all(self) -> list[tuple[Any, int]]:
        """Everything received so far (waiting for at least one message); once the receiver
        failed and everything before the failure was taken, its exception."""
        while not self._items:
            if self._failure is not None:
                raise self._failure
            self._ready.clear()
            await self._ready.wait()
        items, self._items = self._items, []
        self._counts.takes += 1
        if self._arrivals is not None:
            self.taken_arrivals, self._arrivals = self._arrivals, []
        return items


class ReplicaAcker:
    """Sends one connection's ``seqno_ack``s: coalesced, only for partitions that moved.

    ``applied(p)`` after a whole snapshot of ``p`` is applied wakes it, and so does the flusher
    persisting one of the connection's partitions (``Engine.add_persist_listener``, handed to
    the loop once per flush round); it sends what the copy holds now (``Engine.replica_held``)
    for each partition woken since its last look whose figures changed.  WHY not a poll every
    flush interval while something is unpersisted: under a steady write rate that is always, and
    each look read every streamed partition's figures (a fixed cost per interval, not per write).
    ``poll_s`` only bounds how long it trusts the listener alone while a held seqno is not
    persisted.

    While the applier works on a take (``begin_take`` .. ``end_take``) wake-ups only gather: the
    take's acks, and a flush round's that came meanwhile, leave as one message when it ends.
    WHY: each ack message costs both nodes a send, a receive and a decode whatever it carries
    (docs/benchmarks.md, "Cluster": CPU per replicated bulk); a take is applied in one go, so
    holding its first partition's ack until its last is applied delays nothing by more than the
    take itself, except for a partition ``at_once`` names (a handover's target: its source's
    write pause waits for the ack).  Acks are rendered straight to their JSON text (``ack_text``): the generic
    encoder was most of an ack's cost."""

    def __init__(self, engine: Engine, poll_s: float, counts: ReplicationCounts | None = None, *,
                 at_once: Callable[[int], bool] | None = None) -> None:
        self.engine, self.poll_s = engine, poll_s
        #: partitions whose acks leave as soon as they are applied, the take's end not awaited:
        #: a handover's source holds its writes paused until the last items are acknowledged
        self._at_once = at_once
        self._counts = counts if counts is not None else ReplicationCounts()
        self._wake = asyncio.Event()
        self._streamed: set[int] = set()  # partitions the active streams on this connection
        self._woken: set[int] = set()  # partitions to look at next
        self._sent: dict[int, tuple[int, int]] = {}
        self._persisted: set[int] = set()  # from the flusher's thread, not yet handed to the loop
        self._persisted_lock = threading.Lock()
        self._handing = False
        self._busy = False  # the applier is on a take: wake-ups wait for its end
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sent = 0  # acks sent
        self.messages = 0  # WebSocket messages they took
        self.looks = 0  # wake-ups that looked at the engine

    def applied(self, partition: int) -> None:
        self._streamed.add(partition)
        self._woken.add(partition)
        if not self._busy or (self._at_once is not None and self._at_once(partition)):
            self._wake.set()

    def begin_take(self) -> None:
        """The applier starts on what it took from the inbox: acks gather until ``end_take``."""
        self._busy = True

    def end_take(self) -> None:
        """The take is applied: everything woken meanwhile goes out in one look."""
        self._busy = False
        if self._woken:
            self._wake.set()

    def _on_persisted(self, partition: int) -> None:
        """On the flusher's thread, per partition a round persisted: cheap, and one hand-off to
        the loop per burst of calls."""
        if partition not in self._streamed or self._loop is None:
            return
        with self._persisted_lock:
            self._persisted.add(partition)
            if self._handing:
                return
            self._handing = True
        self._counts.persist_handoffs += 1
        try:
            self._loop.call_soon_threadsafe(self._take_persisted)
        except RuntimeError:  # the loop is closed: the connection is gone
            pass

    def _take_persisted(self) -> None:
        with self._persisted_lock:
            persisted, self._persisted, self._handing = self._persisted, set(), False
        self._woken |= persisted
        if not self._busy:
            self._wake.set()

    async def run(self, conn: StreamConnection) -> None:
        self._loop = asyncio.get_running_loop()
        # eager for replica partitions: the active's ``persist_majority`` writes wait for this
        # copy's persistence, and a round gathered here (``engine.flusher.GATHER_S``) would add
        # its wait to each of them; this node's own ``memory`` writes wait for nobody and gather
        remove = self.engine.add_persist_listener(self._on_persisted, replicas_only=True)
        try:
            await self._run(conn)
        finally:
            remove()

    def _poll(self) -> None:
        """The safety net: nothing woke the acker for ``poll_s`` while a held seqno waited to be
        persisted; look at every streamed partition."""
        self._woken |= self._streamed
        self._wake.set()

    async def _run(self, conn: StreamConnection) -> None:
        pending = False
        loop = asyncio.get_running_loop()
        while True:
            # a timer handle, not ``wait_for``: that costs a task per look, and under writes
            # something held is always unpersisted
            timer = loop.call_later(self.poll_s, self._poll) if pending else None
            await self._wake.wait()
            if timer is not None:
                timer.cancel()
            self._wake.clear()
            woken, self._woken = self._woken, set()
            self.looks += 1
            self._counts.ack_looks += 1
            acks: list[str] = []
            for p in sorted(woken):
                held = self.engine.replica_held(p)
                if held != self._sent.get(p):
                    acks.append(ack_text(p, held[0], held[1]))
                    self._sent[p] = held
            pending = any(received > persisted for received, persisted in self._sent.values())
            for i in range(0, len(acks), ACKS_PER_MESSAGE):
                # one WebSocket message for many partitions' acks (the hello said bundle: true)
                part = acks[i:i + ACKS_PER_MESSAGE]
                await conn.ws.send(part[0] if len(part) == 1 else encode_bundle(part))
                self.messages += 1
                self._counts.ack_messages += 1
            self.sent += len(acks)
            self._counts.acks += len(acks)


def ack_text(partition: int, received: int, persisted: int) -> str:
    """``M.encode(M.SeqnoAck(partition, received, persisted))``, rendered directly (the same
    text: tests/cluster/test_replica_acker.py compares them)."""
    return f'{{"type":"seqno_ack","partition":{partition},"received":{received},"persisted":{persisted}}}'


def _ranges(partitions: frozenset[int]) -> str:
    return ",".join(str(p) for p in sorted(partitions))
