"""``create``: one backup run, streamed "until now" from where the previous run ended.

Per partition the stream starts at the previous run's end offset (uuid, seqno, snapshot range) -
or at 0 for the first run - and is bounded at the high seqno the server reports at handshake
(``until_now``), so a run always ends even under constant writes.  The stream's own bound rule
(end after the complete snapshot containing the end seqno) means every run ends on a snapshot
boundary, which is what lets the next run resume without a partial-snapshot rollback.

Rollbacks (the server's history branched since our offset):
  * at or below the run's start: the partition is retaken from the rollback point R in this run,
    and the record notes it; earlier runs are never rewritten - their items above R are masked by
    the chain's ceilings (``chain``), so two histories are never mixed;
  * inside what this run already took (a server restart mid-backup): the segment is cut back to R;
  * deeper than the client can repair narrowly (``PartitionReset``): the partition is retaken in full.
The client library's rollback ring is given floor 0 for every partition: nothing this run wrote
needs correcting from the server (earlier runs are handled by ceilings), so a rollback to any R is
narrow; corrections the library offers are ignored for that reason.

Resume: partitions a killed run committed are kept (``RunWriter.begin``); only the others stream.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.backup.archive import Archive
from clients.backup.errors import BackupError, StreamFailed
from clients.backup.manifest import RunManifest
from clients.backup.runwriter import PartitionWriter, RunWriter
from clients.backup.segment import DEFAULT_BLOCK_BYTES, DEFAULT_LEVEL
from clients.consumer import Consumer
from clients.events import Deletion, Mutation, PartitionReset, Rollback, SnapshotEnd, SnapshotStart, StreamEnd
from clients.http import HttpApi
from clients.offset import StreamOffset
from clients.ring import RollbackRing
from clients.state import MemoryStateStore
from engine.protocol.frames import ItemBatch

#: Ring entries kept for mid-run rollbacks; beyond that a mid-run rollback retakes the partition.
RING_CAPACITY = 50_000


@dataclass(slots=True)
class CreateResult:
    manifest: RunManifest
    resumed: bool
    partitions_taken: int
    partitions_reused: int
    mutations: int = 0
    deletions: int = 0
    bytes: int = 0
    stream_bytes: int = 0
    seconds: float = 0.0
    in_run_rollbacks: list[tuple[int, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        from clients.backup.info import run_info

        return {
            "run": run_info(self.manifest, partitions=False), "resumed": self.resumed,
            "partitions_taken": self.partitions_taken, "partitions_reused": self.partitions_reused,
            "mutations": self.mutations, "deletions": self.deletions, "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "in_run_rollbacks": [{"partition": p, "seqno": s} for p, s in self.in_run_rollbacks],
        }


def server_keyspace(server: str, token: str | None) -> tuple[str, int, dict[int, dict[str, Any]]]:
    """(node id, partition count, partition infos) from the HTTP API: checked before anything is written."""
    with HttpApi(server, token) as api:
        status = api.status()
        parts = api.partitions()
    return str(status["node_id"]), len(parts), {int(p["partition"]): p for p in parts}


def create_backup(
    archive_dir: str | Path,
    server: str,
    *,
    token: str | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    level: int = DEFAULT_LEVEL,
    idle_timeout: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
    name: str = "upr-backup",
) -> CreateResult:
    t0 = time.perf_counter()
    node_id, count, infos = server_keyspace(server, token)
    archive = Archive.open_or_create(archive_dir, node_id, count)
    with archive.lock():
        run = RunWriter.begin(archive, server=server, block_bytes=block_bytes, level=level)
        runs = archive.runs()
        starts = {p: rec.end for p, rec in runs[-1].partitions.items()} if runs else {}
        todo = [p for p in range(count) if p not in run.done]
        reused = count - len(todo)
        result_rollbacks: list[tuple[int, int]] = []
        if todo:
            offsets = {p: starts.get(p, StreamOffset()) for p in todo}
            total = sum(max(0, int(infos.get(p, {}).get("high_seqno", 0)) - offsets[p].seqno) for p in todo)
            driver = _Driver(run, server, token, offsets, idle_timeout, progress, total, f"{name}-{run.run_id}")
            asyncio.run(driver.run())
            result_rollbacks = driver.in_run_rollbacks
        manifest = run.commit(node_id, count)
    return CreateResult(
        manifest=manifest, resumed=run.resumed, partitions_taken=len(todo), partitions_reused=reused,
        mutations=manifest.mutations, deletions=manifest.deletions, bytes=manifest.bytes,
        seconds=time.perf_counter() - t0, in_run_rollbacks=result_rollbacks,
    )


class _Driver:
    """Feeds one consumer's events into the run's partition writers."""

    def __init__(self, run: RunWriter, server: str, token: str | None, offsets: dict[int, StreamOffset],
                 idle_timeout: float, progress: Callable[[int, int], None] | None, total: int, name: str) -> None:
        self.run_writer = run
        self.server = server
        self.token = token
        self.offsets = offsets
        self.idle_timeout = idle_timeout
        self.progress = progress
        self.total = total
        self.done_seqnos = 0
        self.name = name
        self.writers: dict[int, PartitionWriter] = {p: run.partition(p, off) for p, off in offsets.items()}
        self.pending_rollback: dict[int, tuple[StreamOffset, int, str]] = {}
        self.in_run_rollbacks: list[tuple[int, int]] = []

    async def run(self) -> None:
        ring = RollbackRing(RING_CAPACITY)
        for p in self.offsets:
            ring.set_floor(p, 0)
        consumer = Consumer(self.server, token=self.token, name=self.name, partitions=sorted(self.offsets),
                            start="beginning", state=MemoryStateStore(), ring=ring, until_now=True,
                            offsets=self.offsets, max_reconnect_attempts=10)
        try:
            await self._consume(consumer)
        except BaseException:
            for w in self.writers.values():
                w.abort()
            raise
        finally:
            await consumer.close()

    async def _consume(self, consumer: Consumer) -> None:
        it = consumer.batches().__aiter__()
        remaining = set(self.writers)
        while remaining:
            try:
                ev = await asyncio.wait_for(it.__anext__(), self.idle_timeout)
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise StreamFailed(self._stuck(consumer, remaining, f"no progress for {self.idle_timeout:.0f}s"),
                                   partition=min(remaining)) from None
            if type(ev) is ItemBatch:
                p = ev.partition
                self._settle(consumer, p)
                self.writers[p].add_columns(ev.keys, ev.seqnos, ev.cas, ev.revs, ev.deleted, ev.values)
                if self.progress and len(ev.seqnos):
                    self.done_seqnos += len(ev.seqnos)
                    self.progress(min(self.done_seqnos, self.total), self.total)
            elif isinstance(ev, SnapshotStart):
                self._settle(consumer, ev.partition)
                self.writers[ev.partition].snapshot(ev.start, ev.end, ev.source)
            elif isinstance(ev, SnapshotEnd):
                pass
            elif isinstance(ev, (Mutation, Deletion)):
                if not ev.correction:  # batches() yields items only as batches
                    raise BackupError(f"unexpected single item for partition {ev.partition}", partition=ev.partition,
                                      seqno=ev.seqno)
            elif isinstance(ev, Rollback):
                self._rollback(ev.partition, ev.seqno, ev.reason or "", reset=False)
            elif isinstance(ev, PartitionReset):
                self._rollback(ev.partition, ev.rollback_seqno, ev.reason or "", reset=True)
            elif isinstance(ev, StreamEnd):
                p = ev.partition
                if ev.reason == "end_seqno_reached" and p in remaining:
                    self._settle(consumer, p)
                    end = consumer.position(p)
                    pos = consumer.session.positions[p]
                    log = tuple((e.uuid, e.seqno) for e in pos.failover_log)
                    self.writers[p].finish(end, failover_log=log)
                    remaining.discard(p)
                elif ev.reason == "closed":
                    raise StreamFailed(self._stuck(consumer, {p}, "the server closed the stream"), partition=p,
                                       seqno=ev.last_seqno)
        if remaining:
            raise StreamFailed(self._stuck(consumer, remaining, "the stream ended early"), partition=min(remaining))

    def _rollback(self, p: int, seqno: int, reason: str, *, reset: bool) -> None:
        w = self.writers[p]
        if not reset and seqno >= w.start.seqno:
            w.truncate(seqno)  # stays inside this run's range: earlier runs are unaffected
            self.in_run_rollbacks.append((p, seqno))
            return
        requested = w.start
        to = 0 if reset else seqno
        why = reason if not reset or seqno == 0 else f"{reason}; server point {seqno}, retaken in full"
        self.pending_rollback[p] = (requested, to, why)

    def _settle(self, consumer: Consumer, p: int) -> None:
        """After a rollback the first event of the partition tells where the new stream starts."""
        pending = self.pending_rollback.pop(p, None)
        if pending is not None:
            requested, to, why = pending
            start = consumer.position(p)  # the client picked the branch uuid at the rollback point
            if start.seqno != to:
                why = f"{why}; server point {to}, client restarted at {start.seqno}"
            self.writers[p].rollback(requested, start.seqno, start, why)

    def _stuck(self, consumer: Consumer, parts: set[int], why: str) -> str:
        where = ", ".join(f"partition {p} at seqno {consumer.position(p).seqno}" for p in sorted(parts)[:8])
        more = f" and {len(parts) - 8} more" if len(parts) > 8 else ""
        return f"{why}; unfinished: {where}{more}. The run stays partial and the next create resumes it"
