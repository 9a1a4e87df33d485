"""The streaming half of ``create``: one consumer's events into the run's partition writers.

Rollbacks (the server's history branched since our offset, or the server restarted mid-run) are
decided by ``rollbacks.decide``: the partition restarts from the newest seqno where the archive
holds an exact state at or below the server's point - narrowly, never mixing two histories:
earlier runs are never rewritten (their items above the new start are masked by the chain's
ceilings), and this run's segment is cut back when the point lies inside what it already took.
The consumer runs with the client library's ``on_rollback="report"`` policy: it only reports the
rollback point (no key-wise corrections, no partition resets, no ring), and the driver restarts the
partition where the archive is exact with ``Consumer.seek``.  A server that restarts mid-run with
less history than the run's "until now" goal is handled by the library too: it lowers the goal to
the new branch's high seqno (``StreamEnd.lowered_from``).

Resume: partitions a killed run committed are kept (``RunWriter.begin``); the others continue from
the last checkpoint their segment kept (``PartitionWriter.adopt``), or from the run's start.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from clients.backup.chain import links
from clients.backup.errors import BackupError, StreamFailed
from clients.backup.manifest import RunManifest
from clients.backup.rollbacks import decide
from clients.backup.runwriter import PartitionWriter, RunWriter
from clients.consumer import Consumer
from clients.events import PartitionMoved, PartitionsUnavailable, Rollback, SnapshotEnd, SnapshotStart, StreamEnd
from clients.state import MemoryStateStore
from engine.protocol.client.actions import RollbackPolicy
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.session import DEFAULT_WINDOW
from engine.protocol.frames import ItemBatch
from engine.protocol.messages import StreamEndReason


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
    """Feeds one consumer's events into the run's partition writers.

    A rollback whose point R is not a seqno at which the archive holds an exact state (R inside a
    deduplicated snapshot we took: older versions of keys changed again later in that snapshot are
    missing) cannot be resumed at R: the partition is cut back to the nearest exact boundary B < R
    and the consumer is told to restart it from B (``seek``) while it reports the rollback.
    """

    def __init__(self, run: RunWriter, server: str | Sequence[str], token: str | None, offsets: dict[int, StreamOffset],
                 idle_timeout: float, progress: Callable[[int, int], None] | None, total: int, name: str,
                 reconnect_attempts: int = 10, window_bytes: int = DEFAULT_WINDOW) -> None:
        self.reconnect_attempts = reconnect_attempts
        self.window_bytes = window_bytes
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
        self.in_run_rollbacks: list[tuple[int, int]] = []
        self.handoffs: list[tuple[int, int, int]] = []  # (partition, server point, boundary restarted from)
        self.purge_seqnos: dict[int, int] = {}
        self.consumer: Consumer | None = None
        # exact states the archive holds before this run: cross-run rollbacks restart from one of these
        self.archived = archived_boundaries(run.archive.runs(), offsets)

    def _consumer(self) -> Consumer:
        return Consumer(self.server, token=self.token, name=self.name, partitions=sorted(self.offsets),
                        start="beginning", state=MemoryStateStore(), ring_size=0, on_rollback=RollbackPolicy.REPORT,
                        until_now=True, offsets=self.offsets, max_reconnect_attempts=self.reconnect_attempts,
                        window_bytes=self.window_bytes)

    async def run(self) -> None:
        consumer = self.consumer = self._consumer()
        try:
            await self._consume(consumer)
        except BaseException:
            for w in self.writers.values():  # unfinished partitions: kept for the next run to adopt
                if w.partition not in self.run_writer.done:
                    w.suspend()
            raise
        finally:
            await consumer.close()

    async def _consume(self, consumer: Consumer) -> None:
        """One event at a time: the next is requested only once this one was handled, so the
        consumer's processed position is exactly what the writers hold."""
        remaining = set(self.writers)
        events = consumer.batches()
        while remaining:
            try:
                async with asyncio.timeout(self.idle_timeout):
                    ev = await events.__anext__()
            except asyncio.TimeoutError:
                raise StreamFailed(self._stuck(remaining, f"no progress for {self.idle_timeout:.0f}s"),
                                   partition=min(remaining)) from None
            except StopAsyncIteration:
                raise StreamFailed(self._stuck(remaining, "the stream ended early"), partition=min(remaining)) from None
            await self._handle(consumer, ev, remaining)

    async def _handle(self, consumer: Consumer, ev: Any, remaining: set[int]) -> None:
        if isinstance(ev, (PartitionMoved, PartitionsUnavailable)):
            # news, not data: the consumer itself resumes a moved partition on its new active from
            # the position this run's writer holds (a branch there comes as a ``Rollback``)
            return
        p = ev.partition if hasattr(ev, "partition") else None
        if p is None or p not in self.writers:
            return  # barrier/cycle events
        if type(ev) is ItemBatch:
            w = self.writers[p]
            w.add_columns(ev.keys, ev.seqnos, ev.cas, ev.revs, ev.deleted, ev.values)
            w.checkpoint(consumer.position(p).uuid)
            if self.progress and len(ev.seqnos):
                self.done_seqnos += len(ev.seqnos)
                self.progress(min(self.done_seqnos, self.total), self.total)
        elif isinstance(ev, SnapshotStart):
            self.writers[p].snapshot(ev.start, ev.end, ev.source)
            self.purge_seqnos[p] = ev.purge_seqno
        elif isinstance(ev, SnapshotEnd):
            self.writers[p].snapshot_complete(ev.end, consumer.position(p).uuid, ev.start)
        elif isinstance(ev, Rollback):
            await self._rollback(consumer, p, ev)
        elif isinstance(ev, StreamEnd):
            if ev.reason == StreamEndReason.END_SEQNO_REACHED and p in remaining:
                end = consumer.position(p)
                log = tuple((e.uuid, e.seqno) for e in consumer.failover_log(p))
                self.writers[p].finish(end, failover_log=log, purge_seqno=self.purge_seqnos.get(p, 0))
                remaining.discard(p)
            elif ev.reason == StreamEndReason.CLOSED:
                raise StreamFailed(self._stuck({p}, "the server closed the stream"), partition=p,
                                   seqno=ev.last_seqno)
        else:  # batches() hands items over only as batches, and the report policy sends no corrections
            raise BackupError(f"unexpected {type(ev).__name__} for partition {p}", partition=p)

    async def _rollback(self, consumer: Consumer, p: int, ev: Rollback) -> None:
        w = self.writers[p]
        seqno, reason = ev.seqno, ev.reason or ""
        d = decide(point=seqno, start=w.start.seqno, run_boundaries=w.boundaries,
                   archived_boundaries=self.archived.get(p, [0]))
        if d.in_run:
            w.truncate(d.boundary)
            w.restarts.append((seqno, d.boundary))
            self.in_run_rollbacks.append((p, seqno))
            if d.handoff or ev.resume is None:
                start = await self._offset_at(consumer, p, d.boundary)
                self._restart(consumer, p, seqno, start)
            else:
                start = ev.resume  # the client's own resume at the point, on the branch there
            if start.seqno != d.boundary:  # no branch reaches back there: retake this run's part in full
                w.rollback(w.start, 0, start, f"{reason}; server point {seqno}, no branch at {d.boundary}")
            return
        if d.handoff or ev.resume is None:
            start = await self._offset_at(consumer, p, d.boundary)
            self._restart(consumer, p, seqno, start)
        else:
            start = ev.resume  # the client's own resume at the point, on the branch there
        why = reason if start.seqno == seqno else f"{reason}; server point {seqno}, retaken from {start.seqno}"
        w.rollback(w.start, start.seqno, start, why)

    async def _offset_at(self, consumer: Consumer, p: int, seqno: int) -> StreamOffset:
        """A position at ``seqno`` on the server's current branch (from 0 if no branch reaches it)."""
        info = await consumer.partition_info(p)  # in a cluster: the node the partition streams from
        for entry in info.get("failover_log", []):  # newest first
            if int(entry["seqno"]) <= seqno:
                return StreamOffset.at(int(entry["uuid"]), seqno)
        return StreamOffset()

    def _restart(self, consumer: Consumer, p: int, point: int, start: StreamOffset) -> None:
        """Stream ``p`` again from ``start`` instead of the rollback point (called while the
        consumer reports the rollback, so its next stream for ``p`` starts there)."""
        self.handoffs.append((p, point, start.seqno))
        consumer.seek(p, start)

    def _stuck(self, parts: set[int], why: str) -> str:
        def where(p: int) -> str:
            pos = self.consumer.committed().get(p) if self.consumer else None  # None before its handshake
            return f"partition {p} at seqno {pos.seqno if pos is not None else self.offsets[p].seqno}"

        shown = ", ".join(where(p) for p in sorted(parts)[:8])
        more = f" and {len(parts) - 8} more" if len(parts) > 8 else ""
        return f"{why}; unfinished: {shown}{more}. The run stays partial and the next create resumes it"
