"""The streaming half of ``create``: consumers' events into the run's partition writers.

Rollbacks (the server's history branched since our offset, or the server restarted mid-run) are
decided by ``rollbacks.decide``: the partition restarts from the newest seqno where the archive
holds an exact state at or below the server's point - narrowly, never mixing two histories:
earlier runs are never rewritten (their items above the new start are masked by the chain's
ceilings), and this run's segment is cut back when the point lies inside what it already took.
The client library's rollback ring is given floor 0 for every partition so that it reports narrow
rollbacks rather than resets; the corrections it offers are ignored, because the archive is
cut back to an exact boundary instead of being repaired key by key.

Resume: partitions a killed run committed are kept (``RunWriter.begin``); the others continue from
the last checkpoint their segment kept (``PartitionWriter.adopt``), or from the run's start.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from clients.backup.chain import links
from clients.backup.errors import BackupError, StreamFailed
from clients.backup.manifest import RunManifest
from clients.backup.rollbacks import decide
from clients.backup.runwriter import PartitionWriter, RunWriter
from clients.consumer import Consumer
from clients.events import Deletion, Mutation, PartitionReset, Rollback, SnapshotEnd, SnapshotStart, StreamEnd
from clients.offset import StreamOffset
from clients.ring import RollbackRing
from clients.state import MemoryStateStore
from engine.protocol.frames import ItemBatch

#: The ring only has to answer "covers(p, R)" for partitions that have not streamed yet (floor 0:
#: yes), so the client reports narrow rollbacks; a small one keeps its per-item cost low.
RING_CAPACITY = 1024


_DONE = object()


def archived_boundaries(runs: list[RunManifest], partitions: Iterable[int]) -> dict[int, list[int]]:
    """Per partition, the seqnos at which the live chain holds an exact state: each run's start,
    merge floor, end and recorded snapshot ends - but only those at or below the run's ceiling
    (above it the run's items are an abandoned branch)."""
    out: dict[int, list[int]] = {}
    for p in partitions:
        found = [0]
        try:
            chain = links(runs, p) if runs else []
        except BackupError:
            chain = []
        for link in chain:
            rec = link.record
            found.extend(b for b in (rec.start.seqno, rec.merge_floor, rec.end.seqno, *rec.boundaries)
                         if b <= link.ceiling)
        out[p] = sorted(set(found))
    return out


class Driver:
    """Feeds consumers' events into the run's partition writers.

    Normally one consumer streams every partition.  A rollback whose point R is not a seqno at
    which the archive holds an exact state (R inside a deduplicated snapshot we took: older
    versions of keys changed again later in that snapshot are missing) cannot be resumed at R.
    The partition is then cut back to the nearest exact boundary B < R and handed to a second
    consumer that streams it from B; the first consumer's further events for it are ignored.
    """

    def __init__(self, run: RunWriter, server: str, token: str | None, offsets: dict[int, StreamOffset],
                 idle_timeout: float, progress: Callable[[int, int], None] | None, total: int, name: str,
                 reconnect_attempts: int = 10) -> None:
        self.reconnect_attempts = reconnect_attempts
        self.run_writer = run
        self.server = server
        self.token = token
        self.idle_timeout = idle_timeout
        self.progress = progress
        self.total = total
        self.done_seqnos = 0
        self.name = name
        self.writers: dict[int, PartitionWriter] = {p: run.partition(p, off) for p, off in offsets.items()}
        if run.info.get("forced_full"):  # a new chain from 0, recorded like a rollback to 0
            for w in self.writers.values():
                if w.start.seqno and not w.rollbacks:
                    w.rollback(w.start, 0, StreamOffset(), "full backup requested")
        # partitions a killed run had partly streamed continue from their last checkpoint
        self.resumed_at = {p: w.resume_offset.seqno for p, w in self.writers.items() if w.resume_offset}
        self.offsets = {p: w.resume_offset or w.start for p, w in self.writers.items()}
        self.pending_rollback: dict[int, tuple[StreamOffset, int, str]] = {}
        self.in_run_rollbacks: list[tuple[int, int]] = []
        self.handoffs: list[tuple[int, int, int]] = []  # (partition, server point, boundary used)
        self.owner: dict[int, int] = {p: 0 for p in offsets}
        self.seen_reconnects: dict[int, int] = {}
        self.purge_seqnos: dict[int, int] = {}
        self.consumers: dict[int, Consumer] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.queue: asyncio.Queue[tuple[int, Any, asyncio.Future[None] | None]] = asyncio.Queue()
        # exact states the archive holds before this run: cross-run rollbacks restart from one of these
        self.archived = archived_boundaries(run.archive.runs(), offsets)

    def _consumer(self, partitions: list[int], offsets: dict[int, StreamOffset],
                  end_seqnos: dict[int, int] | None = None) -> Consumer:
        ring = RollbackRing(RING_CAPACITY)
        for p in partitions:
            ring.set_floor(p, 0)
        return Consumer(self.server, token=self.token, name=f"{self.name}-{len(self.consumers)}",
                        partitions=partitions, start="beginning", state=MemoryStateStore(), ring=ring,
                        until_now=end_seqnos is None, end_seqnos=end_seqnos, offsets=offsets,
                        max_reconnect_attempts=self.reconnect_attempts)

    def _start(self, consumer: Consumer) -> int:
        sid = len(self.consumers)
        self.consumers[sid] = consumer
        self.tasks.append(asyncio.ensure_future(self._pump(sid, consumer)))
        return sid

    async def _pump(self, sid: int, consumer: Consumer) -> None:
        """One consumer's events, one at a time: the next is requested only once this one was
        handled, so the consumer's processed position is exactly what the writers hold."""
        loop = asyncio.get_running_loop()
        try:
            async for ev in consumer.batches():
                fut: asyncio.Future[None] = loop.create_future()
                await self.queue.put((sid, ev, fut))
                await fut
            await self.queue.put((sid, _DONE, None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the main loop, which raises it
            await self.queue.put((sid, exc, None))

    async def run(self) -> None:
        self._start(self._consumer(sorted(self.offsets), self.offsets, None))
        try:
            await self._consume()
        except BaseException:
            for w in self.writers.values():  # unfinished partitions: kept for the next run to adopt
                if w.partition not in self.run_writer.done:
                    w.suspend()
            raise
        finally:
            for t in self.tasks:
                t.cancel()
            for t in self.tasks:
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
            for c in self.consumers.values():
                await c.close()

    async def _consume(self) -> None:
        remaining = set(self.writers)
        poll = min(1.0, self.idle_timeout)
        idle = 0.0
        while remaining:
            try:
                sid, ev, fut = await asyncio.wait_for(self.queue.get(), poll)
            except asyncio.TimeoutError:
                idle += poll
                await self._after_reconnects(remaining)
                if idle >= self.idle_timeout:
                    raise StreamFailed(self._stuck(remaining, f"no progress for {self.idle_timeout:.0f}s"),
                                       partition=min(remaining)) from None
                continue
            idle = 0.0
            try:
                if ev is _DONE:
                    mine = {p for p in remaining if self.owner[p] == sid}
                    if mine:
                        raise StreamFailed(self._stuck(mine, "the stream ended early"), partition=min(mine))
                    continue
                if isinstance(ev, BaseException):
                    raise ev
                await self._handle(sid, ev, remaining)
                await self._after_reconnects(remaining)
            finally:
                if fut is not None and not fut.done():
                    fut.set_result(None)

    async def _after_reconnects(self, remaining: set[int]) -> None:
        """A consumer reconnected (the server restarted?): a partition whose new history ends below
        the consumer's "until now" bound (frozen at its first handshake) would wait forever for
        writes that may never come, so it is handed to a fresh stream bounded at the new "now"."""
        for sid, consumer in list(self.consumers.items()):
            if consumer.reconnects <= self.seen_reconnects.get(sid, 0):
                continue
            self.seen_reconnects[sid] = consumer.reconnects
            mine = [p for p in remaining if self.owner[p] == sid]
            if not mine:
                continue
            highs = {int(i["partition"]): int(i["high_seqno"]) for i in await consumer.http.partitions()}
            for p in mine:
                end = consumer.session.end_seqnos.get(p)
                if end is None or highs.get(p, 0) >= end:
                    continue
                w = self.writers[p]
                boundary = w.boundary_at_or_below(consumer.position(p).seqno)
                w.truncate(boundary)
                w.restarts.append((highs.get(p, 0), boundary))
                start = await self._offset_at(consumer, p, boundary)
                if start.seqno != boundary:
                    w.rollback(w.start, 0, start, f"history after a server restart has no branch at {boundary}")
                self.in_run_rollbacks.append((p, boundary))
                self._handoff(p, highs.get(p, 0), start)

    async def _handle(self, sid: int, ev: Any, remaining: set[int]) -> None:
        p = ev.partition if hasattr(ev, "partition") else None
        if p is None or self.owner.get(p) != sid:
            return  # barrier/cycle events, or a partition handed to another consumer
        consumer = self.consumers[sid]
        if type(ev) is ItemBatch:
            self._settle(consumer, p)
            w = self.writers[p]
            w.add_columns(ev.keys, ev.seqnos, ev.cas, ev.revs, ev.deleted, ev.values)
            w.checkpoint(consumer.position(p).uuid)
            if self.progress and len(ev.seqnos):
                self.done_seqnos += len(ev.seqnos)
                self.progress(min(self.done_seqnos, self.total), self.total)
        elif isinstance(ev, SnapshotStart):
            self._settle(consumer, p)
            self.writers[p].snapshot(ev.start, ev.end, ev.source)
            self.purge_seqnos[p] = ev.purge_seqno
        elif isinstance(ev, SnapshotEnd):
            self.writers[p].snapshot_complete(ev.end, consumer.position(p).uuid, ev.start)
        elif isinstance(ev, (Mutation, Deletion)):
            if not ev.correction:  # batches() yields items only as batches
                raise BackupError(f"unexpected single item for partition {p}", partition=p, seqno=ev.seqno)
            # corrections repair a downstream copy; ours is cut back to an exact boundary instead
        elif isinstance(ev, Rollback):
            await self._rollback(consumer, p, ev.seqno, ev.reason or "", reset=False)
        elif isinstance(ev, PartitionReset):
            await self._rollback(consumer, p, ev.rollback_seqno, ev.reason or "", reset=True)
        elif isinstance(ev, StreamEnd):
            if ev.reason == "end_seqno_reached" and p in remaining:
                self._settle(consumer, p)
                end = consumer.position(p)
                log = tuple((e.uuid, e.seqno) for e in consumer.session.positions[p].failover_log)
                self.writers[p].finish(end, failover_log=log, purge_seqno=self.purge_seqnos.get(p, 0))
                remaining.discard(p)
            elif ev.reason == "closed":
                raise StreamFailed(self._stuck({p}, "the server closed the stream"), partition=p,
                                   seqno=ev.last_seqno)

    async def _rollback(self, consumer: Consumer, p: int, seqno: int, reason: str, *, reset: bool) -> None:
        w = self.writers[p]
        d = decide(point=seqno, start=w.start.seqno, run_boundaries=w.boundaries,
                   archived_boundaries=self.archived.get(p, [0]), reset=reset, reconnected=consumer.reconnects > 0)
        if d.in_run:
            w.truncate(d.boundary)
            w.restarts.append((seqno, d.boundary))
            self.in_run_rollbacks.append((p, seqno))
            if d.handoff:
                start = await self._offset_at(consumer, p, d.boundary)
                if start.seqno != d.boundary:  # no branch reaches back there: retake this run's part in full
                    w.rollback(w.start, 0, start, f"{reason}; server point {seqno}, no branch at {d.boundary}")
                self._handoff(p, seqno, start)
            return
        if not d.handoff:
            self.pending_rollback[p] = (w.start, seqno, reason)  # settled at the partition's next event
            return
        start = await self._offset_at(consumer, p, d.boundary)
        why = reason if start.seqno == seqno else f"{reason}; server point {seqno}, retaken from {start.seqno}"
        w.rollback(w.start, start.seqno, start, why)
        self._handoff(p, seqno, start)

    async def _offset_at(self, consumer: Consumer, p: int, seqno: int) -> StreamOffset:
        """A position at ``seqno`` on the server's current branch (from 0 if no branch reaches it)."""
        infos = await consumer.http.partitions()
        info = next((i for i in infos if int(i["partition"]) == p), None)
        for entry in (info or {}).get("failover_log", []):  # newest first
            if int(entry["seqno"]) <= seqno:
                return StreamOffset.at(int(entry["uuid"]), seqno)
        return StreamOffset()

    def _handoff(self, p: int, point: int, start: StreamOffset) -> None:
        """Stream ``p`` from ``start`` on a new consumer, bounded at the server's "now" as of its handshake."""
        self.handoffs.append((p, point, start.seqno))
        self.pending_rollback.pop(p, None)
        self.owner[p] = self._start(self._consumer([p], {p: start}, None))

    def _settle(self, consumer: Consumer, p: int) -> None:
        """After a rollback the first event of the partition tells where the new stream starts."""
        pending = self.pending_rollback.pop(p, None)
        if pending is not None:
            requested, to, why = pending
            start = consumer.position(p)  # the client picked the branch uuid at the rollback point
            if start.seqno != to:
                why = f"{why}; server point {to}, client restarted at {start.seqno}"
            self.writers[p].rollback(requested, start.seqno, start, why)

    def _stuck(self, parts: set[int], why: str) -> str:
        def where(p: int) -> str:
            pos = self.consumers[self.owner[p]].session.positions.get(p)  # None before its handshake
            return f"partition {p} at seqno {pos.offset().seqno if pos is not None else self.offsets[p].seqno}"

        shown = ", ".join(where(p) for p in sorted(parts)[:8])
        more = f" and {len(parts) - 8} more" if len(parts) > 8 else ""
        return f"{why}; unfinished: {shown}{more}. The run stays partial and the next create resumes it"
