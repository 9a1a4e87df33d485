"""The engine facade (contract: docs/architecture.md, "Engine facade").

Threads: any number of callers (the app's executor threads), one flusher thread.  Writes,
state changes and the flusher's "persisted up to" step serialise on one writer lock; reads
(``get``, ``stats``, ``snapshot``) take no lock: they read immutable queue roots and LMDB
read transactions.

The per-item LMDB loops (a write batch's by-key lookups, a flush round's by-key replaces and
block puts) also take turns on one more lock (``engine.flusher.lmdb_turn`` says why).

A write's life: ``engine.batch_writer`` validates it, gives it a seqno, CAS and rev and appends
it to its partition's write queue; it is visible to snapshots when the batch publishes its
queue roots.  Listeners are told which partitions moved.  The flusher persists it later;
``persist_future`` waits for that.  When a partition's failover log gets an entry is
``engine.core.failover_policy``'s decision.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from concurrent.futures import Future

import lmdb

from engine import gc_tuning
from engine.batch_writer import BatchWriter
from engine.config import EngineConfig
from engine.core import failover, failover_policy
from engine.core.errors import (
    Backpressure,
    EngineClosed,
    NotReplica,
    InvalidInput,
    InvalidPartition,
    KeyNotFound,
    PartitionNotActive,
    SeqnoRangeError,
    UprError,
)
from engine.core.gc_policy import GcPolicy
from engine.core.keys import encode_key, partition_for_key
from engine.core.replica_snapshots import ReplicaSnapshots, SnapshotMark
from engine.core.types import (
    Document,
    FailoverEntry,
    Item,
    Op,
    PartitionState,
    PartitionStats,
    WriteOp,
    WriteResult,
)
from engine.flush_health import FlushFault
from engine import lock_holds
from engine.flusher import Flusher, lmdb_turn
from engine.partition import Partition
from engine.cluster.replica_rollback import Resync, Undo
from engine.replica_undo import UndoResult, undo_above
from engine.replica import (ByKeyReader, ItemsStep, MarkerStep, ReplicaStep, append_items, apply_items,
                            reads_persisted_records)
from engine.protocol.frames import Columns
from engine.snapshot import PartitionSnapshot, capture, capture_memory_only, memory_backlog, memory_frame
from engine.storage.store import Store
from engine.writequeue import QueueBytes, WriteQueue

log = logging.getLogger(__name__)


class Engine:
    """Partitions, write queues, LMDB store and flusher behind one thread-safe facade."""

    def __init__(self, config: EngineConfig, store: Store, partitions: list[Partition], was_clean: bool) -> None:
        self.config = config
        self.num_partitions = store.num_partitions
        self.node_id = store.node_id
        self.opened_clean = was_clean
        self._store = store
        self._parts = partitions
        self._lock = lock_holds.timed(threading.RLock(), "writer_lock")
        self._turn = lock_holds.timed(lmdb_turn(), "lmdb_turn")
        self._closed = False
        #: every partition queue's bytes in one number, read by each write's backpressure check
        self._queue_bytes = QueueBytes()
        for part in partitions:
            part.queue.count_in(self._queue_bytes)
        self._listeners: list[Callable[[int], None]] = []
        self._batch_listeners: list[Callable[[Any], None]] = []
        self._writer = BatchWriter(partitions, store, self._turn, max_key_bytes=config.max_key_bytes,
                                   max_value_bytes=config.max_value_bytes,
                                   last_cas=max((p.persisted_max_cas for p in partitions), default=0))
        self._flusher = Flusher(store, partitions, self._lock, config.flush_interval_ms / 1000.0,
                                config.flush_batch_items, self._turn, config.flush_retry_max_s)
        self._persist_listeners: list[Callable[[int], None]] = []
        self._flusher.on_persisted = self._notify_persisted
        self.backpressure_total = 0
        self.closed_clean: bool | None = None

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, config: EngineConfig) -> "Engine":
        """Create or open ``config.data_dir`` and start the flusher.

        An unclean previous stop adds a failover entry (new uuid, persisted seqno) to every
        partition (``engine.core.failover_policy``); seqnos continue from the persisted seqno.
        """
        if config.partitions < 1:
            raise InvalidInput("partitions must be at least 1", field="partitions")
        if config.gc_young_threshold:
            gc_tuning.apply(GcPolicy(config.gc_young_threshold, config.gc_middle_threshold, config.gc_full_interval_s))
        opened = Store.open(config.data_dir, config.partitions, config.lmdb_map_size, config.failover_log_cap)
        parts = [
            Partition(
                id=p, state=m.state, failover_log=m.failover_log, purge_seqno=m.purge_seqno,
                live_items=m.live_items, persisted_live=m.live_items, persisted_max_cas=m.max_cas,
                queue=WriteQueue(m.persisted_seqno),
                snapshots=ReplicaSnapshots.restored(m.snapshot, m.persisted_seqno),
            )
            for p, m in enumerate(opened.partitions)
        ]
        engine = cls(config, opened.store, parts, opened.was_clean)
        engine._flusher.start()
        return engine

    def close(self) -> None:
        """Clean shutdown: flush everything, record the clean marker, stop the flusher."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._flusher.stop()
        try:
            lost = {p.id: (p.queue.persisted + 1, p.queue.root.high, p.queue.depth)
                    for p in self._parts if p.queue.root.high > p.queue.persisted}
            if not lost:
                self._store.mark_clean()
            else:  # a failed final flush: the next open must treat this stop as unclean
                fault = self._flusher.fault
                why = fault.describe() if fault is not None else "the final flush failed"
                log.error(
                    "engine closed with unpersisted writes, which are lost (%s): %d item(s) in %d partition(s): %s; "
                    "persisted data up to each partition's persisted seqno is kept; the next open starts a "
                    "new history branch (failover entry) in every partition", why,
                    sum(n for _lo, _hi, n in lost.values()), len(lost),
                    ", ".join(f"partition {p} seqnos {lo}..{hi} ({n} item(s))" for p, (lo, hi, n) in sorted(lost.items())[:16]))
            self.closed_clean = not lost
        finally:
            self._store.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def flusher_running(self) -> bool:
        """Whether the flusher thread is alive (readiness checks)."""
        return self._flusher.running

    @property
    def flush_fault(self) -> FlushFault | None:
        """Why flushing to disk fails right now (readiness, metrics), or None while it works."""
        return self._flusher.fault

    @property
    def writes_total(self) -> int:
        return self._writer.writes_total

    @property
    def write_errors_total(self) -> int:
        return self._writer.write_errors_total

    def partition_of(self, key: str) -> int:
        """The partition that owns ``key`` (``engine.core.keys.partition_for_key``)."""
        return partition_for_key(encode_key(key, self.config.max_key_bytes), self.num_partitions)

    # ------------------------------------------------------------------ writes

    def write(self, op: WriteOp) -> WriteResult:
        result = self.write_batch((op,))[0]
        if isinstance(result, UprError):
            raise result
        return result

    def write_batch(self, ops: Sequence[tuple[Op, str, bytes, int | None]]) -> list[WriteResult | UprError]:
        """Queue ``ops`` in order; per-item results, a failed item changes nothing.

        Each op is a ``WriteOp`` or a plain ``(op, key, value, cas)`` tuple (the same thing
        without the class: the bulk path builds thousands and skips that cost).

        ``cas`` of None or 0 means "no check" (as in Couchbase).  A CAS write against a
        missing or deleted key fails with ``CasMismatch`` (actual 0); deleting a missing or
        deleted key fails with ``KeyNotFound``.  The whole batch is refused with
        ``Backpressure`` while the queues hold more than ``queue_memory_limit_bytes``, or more
        than ``flush_failure_backlog_bytes`` while flushing fails (``flush_fault``).
        """
        if self._closed:
            raise EngineClosed("engine is closed")
        queued = self._queue_bytes.bytes
        if queued > self.config.queue_memory_limit_bytes:
            self.backpressure_total += 1
            self._flusher.kick()
            raise Backpressure("write queues are over their memory limit; retry shortly")
        fault = self._flusher.fault
        if fault is not None and queued > self.config.flush_failure_backlog_bytes:
            # nothing can reach the disk: past this bound, taking more only grows what a stop loses
            self.backpressure_total += 1
            raise Backpressure(
                f"nothing was written: flushing to disk is failing ({fault.describe()}) and {queued} bytes "
                f"are unpersisted, over the {self.config.flush_failure_backlog_bytes} bytes allowed during "
                "a flush failure; retry once space returns")
        with self._lock:
            if self._closed:
                raise EngineClosed("engine is closed")
            results, written = self._writer.write(ops, time.time_ns())
        if written:
            self._notify(written)
        return results

    def persist_future(self, targets: Mapping[int, int]) -> Future[None]:
        """Resolves once ``persisted_seqno[p] >= targets[p]`` for every ``p``.

        Kicks a flush at once; waiters registered before a flush round starts share its
        single fsync.
        """
        for p, seqno in targets.items():
            part = self._part(p)
            if seqno > part.high_seqno:
                raise SeqnoRangeError(
                    f"seqno {seqno} is beyond partition {p}'s high seqno {part.high_seqno}",
                    partition=p, seqno=seqno,
                )
        if self._closed:
            raise EngineClosed("engine is closed")
        return self._flusher.wait_for(targets)

    def flush_now(self) -> None:
        """Block until everything queued at the time of the call is persisted."""
        if self._closed:
            raise EngineClosed("engine is closed")
        self._flusher.wait_for({p.id: p.high_seqno for p in self._parts}).result()

    # ------------------------------------------------------------------ reads

    def get(self, key: str) -> Document:
        raw = encode_key(key, self.config.max_key_bytes)
        p = partition_for_key(raw, self.num_partitions)
        item = self._parts[p].queue.index.get(raw)
        if item is None:
            self._check_open()
            try:
                with self._store.read_txn() as txn:
                    item = self._store.get_item(txn, p, raw)
            except lmdb.Error:
                self._raise_if_closed()
                raise
        if item is None or item.deleted:
            raise KeyNotFound(f"no live document for key {key!r}", partition=p)
        return Document(key, p, item.seqno, item.cas, item.rev, item.deleted, item.value)

    def stats(self, partition: int) -> PartitionStats:
        return self._part(partition).stats()

    def all_stats(self) -> list[PartitionStats]:
        return [p.stats() for p in self._parts]

    def failover_log(self, partition: int) -> tuple[FailoverEntry, ...]:
        return self._part(partition).failover_log

    def high_seqno(self, partition: int) -> int:
        return self._part(partition).high_seqno

    def persisted_seqno(self, partition: int) -> int:
        return self._part(partition).persisted_seqno

    def state(self, partition: int) -> PartitionState:
        return self._part(partition).state

    def memory_snapshot(self, partition: int, after_seqno: int) -> PartitionSnapshot | None:
        """``snapshot(partition, after_seqno)`` when it has no disk part, taken without LMDB (safe
        on an event loop: one attribute read of an immutable queue root); None when a disk part
        may be needed."""
        part = self._part(partition)
        return capture_memory_only(partition, part.queue.root, after_seqno, part.purge_seqno)

    def memory_frame(self, partition: int, after_seqno: int, max_backlog: int, max_items: int,
                     max_bytes: int) -> tuple[int, int, Columns] | None:
        """``(high seqno, purge seqno, items)`` when ``memory_snapshot(partition, after_seqno)``
        is one memory part of at most ``max_backlog`` seqnos whose items are one batch of
        ``columns(max_items, max_bytes)``; else None (see ``engine.snapshot.memory_frame``).  Safe
        on an event loop, like ``memory_snapshot``."""
        part = self._part(partition)
        root = part.queue.root
        cols = memory_frame(root, after_seqno, max_backlog, max_items, max_bytes)
        return None if cols is None else (root.high, part.purge_seqno, cols)

    def memory_backlog(self, partition: int, after_seqno: int) -> int | None:
        """How many seqnos a memory-only snapshot after ``after_seqno`` covers, or None when a
        disk part may be needed (see ``memory_snapshot``)."""
        return memory_backlog(self._part(partition).queue.root, after_seqno)

    def snapshot(self, partition: int, after_seqno: int) -> PartitionSnapshot:
        """A consistent view of ``(after_seqno, high seqno now]`` (see engine.snapshot)."""
        part = self._part(partition)
        if after_seqno < 0 or after_seqno > part.high_seqno:
            raise SeqnoRangeError(
                f"after_seqno {after_seqno} is outside 0..{part.high_seqno} for partition {partition}",
                partition=partition, seqno=after_seqno,
            )
        self._check_open()
        queue = part.queue
        try:
            return capture(self._store, partition, lambda: queue.root, after_seqno, part.purge_seqno)
        except lmdb.Error:
            self._raise_if_closed()
            raise

    # ------------------------------------------------------------------ admin

    def set_state(self, partition: int, state: PartitionState) -> None:
        """Change a partition's state; becoming active from any other state starts a new
        history branch (failover entry: new uuid, current high seqno), as
        ``engine.core.failover_policy`` decides.

        Durable on return, but the commit (a write transaction and its fsync, possibly behind a
        flush round) runs after the writer lock is released: the change is staged under the lock
        (``Store.stage``), so any flush of a write taken under the new state carries it in the
        same commit, and this node's writes do not wait for the fsync (a rebalance calls this
        for every copy it creates).  If the commit fails the state is changed in memory and stays
        staged: the next write transaction carries it."""
        part = self._part(partition)
        state = PartitionState(state)
        with self._lock:
            self._check_open()
            if part.state is state:
                return
            part.writes_stopped = False  # a handover's pause belongs to the state it paused
            change = failover_policy.StateChanged(part.state, state, part.high_seqno)
            log_ = failover_policy.apply(part.failover_log, change, self.config.failover_log_cap)
            store = self._store

            def put(txn: object) -> None:
                store.put_state(txn, partition, state)  # type: ignore[arg-type]
                store.put_failover(txn, partition, log_)  # type: ignore[arg-type]

            # staged under the writer lock, so it lands before any write the new state lets in
            store.stage(put)  # type: ignore[arg-type]
            if state is PartitionState.REPLICA:  # what it holds so far is whole: its own history
                persisted = part.persisted_seqno
                part.snapshots = ReplicaSnapshots.restored(SnapshotMark(persisted, persisted, persisted), persisted)
            part.state = state
            part.failover_log = log_
        self._commit_staged_durably()
        self._notify((partition,))

    # ------------------------------------------------------------------ replica copies

    def replica_marker(self, partition: int, start: int, end: int) -> None:
        """A replicated snapshot ``(start, end)`` begins on replica ``partition`` (its items follow
        through ``apply_replicated``)."""
        part = self._replica(partition)
        with self._lock:
            self._check_open()
            self._replica(partition)
            part.snapshots = part.snapshots.marker(start, end, part.high_seqno)

    def apply_replicated(self, partition: int, items: Sequence[Item], *, last: bool) -> None:
        """Apply replicated ``items`` to replica ``partition`` keeping the active's seqno, CAS, rev
        and deletions; ``last``: the current snapshot is whole (its end becomes the high seqno).
        A bad batch (``InvalidInput``) changes nothing."""
        part = self._replica(partition)
        with self._lock:
            self._check_open()
            self._replica(partition)
            max_cas = apply_items(part, self._store, self._turn, items, last=last)
            if max_cas > self._writer.last_cas:  # a promoted copy's CAS must keep increasing
                self._writer.last_cas = max_cas
        self._notify((partition,))

    def apply_replica_run(self, steps: Sequence[ReplicaStep]) -> None:
        """Apply received markers and item batches in order (``replica_marker`` and
        ``apply_replicated`` each), under one writer lock, one LMDB turn and one read
        transaction.  WHY: a busy active sends each partition's snapshots as a marker and a
        batch of a few items, and a replica taking both locks and a transaction per message
        waited for the flusher and the writers between every two of them.  A bad step
        (``InvalidInput``) changes nothing of its own; the steps before it stay applied."""
        for step in steps:
            self._replica(step.partition)
        moved: dict[int, None] = {}
        try:
            with self._lock, self._turn:
                self._apply_steps(steps, moved)
        finally:
            self._notify(moved)

    def try_apply_replica_run(self, steps: Sequence[ReplicaStep]) -> bool:
        """``apply_replica_run`` if the writer lock and the LMDB turn are free at once, else
        nothing (False).  WHY: the replication applier runs on the event loop; a small run
        applied there costs no thread hop (a hop per received batch was the replica's largest
        fixed cost per write, docs/benchmarks.md "Cluster"), but the loop must never wait for
        a lock the flusher or a writer holds, nor read LMDB (a rewrite of a key only the
        persisted records know, ``reads_persisted_records``): then the caller hops to a thread
        as before."""
        partitions = {step.partition: None for step in steps}
        for p in partitions:
            self._replica(p)
        if not self._lock.acquire(blocking=False):
            return False
        if not self._turn.acquire(blocking=False):
            self._lock.release()
            return False
        try:
            # each partition looked up (and its state checked) once under the lock, not per step:
            # a packed pass is one step pair per partition (bench.replica_apply_cpu)
            parts = {p: self._replica(p) for p in partitions}
        except BaseException:
            self._turn.release()
            self._lock.release()
            raise
        if reads_persisted_records(steps, parts.__getitem__):  # an LMDB read: not on the loop
            self._turn.release()
            self._lock.release()
            return False
        moved: dict[int, None] = {}
        try:
            try:
                self._apply_steps(steps, moved, parts)
            finally:
                self._turn.release()
                self._lock.release()
        finally:
            self._notify(moved)
        return True

    def _apply_steps(self, steps: Sequence[ReplicaStep], moved: dict[int, None],
                     parts: Mapping[int, Partition] | None = None) -> None:
        """``apply_replica_run``'s work, under the writer lock and the LMDB turn; the
        partitions it appended to go into ``moved`` (the caller announces them unlocked).
        ``parts``: the steps' partitions, already looked up under the same lock."""
        self._check_open()
        reader = ByKeyReader(self._store)
        part_of = parts.__getitem__ if parts is not None else self._replica
        try:
            for step in steps:
                part = part_of(step.partition)
                if type(step) is MarkerStep:
                    part.snapshots = part.snapshots.marker(step.start, step.end, part.high_seqno)
                    continue
                assert type(step) is ItemsStep
                max_cas = append_items(part, reader, step.items, last=step.last)
                moved[step.partition] = None
                if max_cas > self._writer.last_cas:  # a promoted copy's CAS must keep increasing
                    self._writer.last_cas = max_cas
        finally:
            reader.close()

    def adopt_failover_log(self, partition: int, log: Sequence[FailoverEntry]) -> None:
        """Replica ``partition``'s history is its active's: store the active's failover log.

        Durable on return; staged under the writer lock and committed after it (as ``set_state``),
        so this node's writes do not wait for the fsync."""
        part = self._replica(partition)
        adopted = failover.sanitise(log)[: self.config.failover_log_cap]
        store = self._store
        with self._lock:
            self._check_open()
            self._replica(partition)
            if adopted == part.failover_log:
                return
            store.stage(lambda txn: store.put_failover(txn, partition, adopted))
            part.failover_log = adopted
        self._commit_staged_durably()

    def replica_mark(self, partition: int) -> tuple[int, SnapshotMark]:
        """(high seqno, where the copy stands there): the position a replica stream resumes from
        and its last complete snapshot end."""
        part = self._part(partition)
        high = part.high_seqno
        return high, part.snapshots.at(high)

    def replica_held(self, partition: int) -> tuple[int, int]:
        """(last whole snapshot end held, last whole snapshot end persisted): what a replica
        acknowledges to its active (``seqno_ack``).  Whole snapshots only, because a promotion
        starts the new branch at the last whole one and drops the rest: counting a partial
        snapshot would acknowledge writes a failover takes back.

        Lock-free (attribute reads, safe on the event loop): the persisted seqno is read before
        the snapshot marks, and the flusher moves the seqno first, so the marks read always
        reach it (or their base is already past it and persisted too)."""
        part = self._part(partition)
        persisted = part.persisted_seqno
        high = part.high_seqno
        snapshots = part.snapshots
        held = snapshots.at(max(high, snapshots.base_seqno)).complete_end
        on_disk = snapshots.at(max(persisted, snapshots.base_seqno)).complete_end
        return held, min(on_disk, held)

    def promote(self, partition: int) -> FailoverEntry:
        """Failover: replica ``partition`` becomes active and starts a new history branch at the end
        of the last snapshot it holds whole (``failover_policy.Promoted``); returns the entry."""
        part = self._replica(partition)
        with self._lock:
            self._check_open()
            self._replica(partition)
            complete = part.snapshots.at(part.high_seqno).complete_end
            self._activate(part, failover_policy.Promoted(complete))
        self._notify((partition,))
        return part.failover_log[0]

    def stop_writes(self, partition: int, *, wait: bool = True) -> int | None:
        """Graceful handover, the old active's half: active ``partition`` takes no more writes
        (each gets ``PartitionNotActive``, a retryable refusal) but stays active, so its streams
        keep sending what it holds; returns its high seqno, the last seqno it will ever give out
        until ``resume_writes`` or a state change.  Under the writer lock, so no write in flight
        gets a seqno above the one returned.

        With ``wait=False`` nothing changes and None is returned when the writer lock is busy:
        the call does no I/O, so an event loop makes it itself and hops to a thread only when a
        write holds the lock (the hop is a step of the handover's write pause)."""
        part = self._part(partition)
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            self._check_open()
            if part.state is not PartitionState.ACTIVE:
                raise PartitionNotActive(f"partition {partition} is {part.state.value}, not active",
                                         partition=partition)
            part.writes_stopped = True
            return part.high_seqno
        finally:
            self._lock.release()

    def resume_writes(self, partition: int) -> None:
        """A handover was called off before the map moved: the active takes writes again."""
        part = self._part(partition)
        with self._lock:
            part.writes_stopped = False

    def writes_stopped(self, partition: int) -> bool:
        return self._part(partition).writes_stopped

    def take_over(self, partition: int, *, commit: bool = True, wait: bool = True) -> bool:
        """Handover: replica ``partition`` becomes active keeping its failover log as is (the old
        active streamed it everything and stopped taking writes first; no new branch).

        The partition takes writes as soon as its state changes in memory; the stored state is
        staged (``Store.stage``) and committed after, so the writes paused by the handover do not
        wait for the flusher's transaction and an fsync.  The stored state still lands first:
        any flush of a write taken as active is a later transaction and carries it, so a crash
        leaves the replica's state with none of those writes on disk, or the active state.
        With ``commit=False`` the caller commits (``commit_states``) once it has let the
        waiting writes go; until then a crash restarts the copy as the replica it was, which a
        cluster node resolves from the map anyway.

        With ``wait=False`` nothing changes and False is returned when the writer lock is busy:
        with ``commit=False`` the call never blocks on I/O, so an event loop may make it itself
        and hop to a thread only when the lock is taken (a thread hop on a busy node costs more
        than the takeover, see docs/benchmarks.md "Cluster")."""
        part = self._replica(partition)
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            self._check_open()
            self._replica(partition)
            self._activate(part, failover_policy.TakenOver(), staged=True)
        finally:
            self._lock.release()
        self._notify((partition,))
        if commit:
            self.commit_states()
        return True

    def commit_states(self) -> bool:
        """Commit the partition states ``take_over`` staged, unless a flush already carried them;
        True if this call wrote them.  Cheap when there is nothing to commit."""
        if self._closed:  # ``close`` commits them with its clean marker
            return False
        return self._store.commit_staged()

    def _commit_staged_durably(self) -> None:
        """Return once everything staged so far is committed (by this call, or by the write
        transaction that carried it, which it waits for).  Called without the writer lock."""
        if self._closed:  # ``close`` commits what is staged with its clean marker
            return
        self._store.commit_staged_durably()

    def reset_partition(self, partition: int) -> None:
        """Empty replica ``partition`` (items, meta, failover log) so it streams again from 0: a
        replica's answer to a rollback it cannot undo (``undo_replica``)."""
        part = self._replica(partition)
        with self._lock:
            self._check_open()
            self._replica(partition)
            # queue first, generation second: a flush round that read the old queue holds the old
            # generation (the flusher reads it before the queue) and skips it inside its own
            # transaction, before or after the drop below
            part.queue.reset(0)
            part.generation += 1
            store = self._store

            def drop(txn: object) -> None:
                store.drop_partition(txn, partition)  # type: ignore[arg-type]

            store.write(drop)
            part.live_items = part.persisted_live = 0
            part.purge_seqno = 0
            part.failover_log = ()
            part.snapshots = ReplicaSnapshots()
        self._notify((partition,))

    def undo_replica(self, partition: int, seqno: int) -> UndoResult:
        """Roll replica ``partition`` back to ``seqno`` by undoing what it holds above it, keeping
        every seqno, CAS and rev below (``engine.replica_undo``; what is restored and when an
        undo cannot be exact: ``engine.cluster.replica_rollback``).  Returns the result: with a
        ``Resync`` plan nothing changed, and the caller resets the partition instead."""
        part = self._replica(partition)
        if not 0 <= seqno <= part.high_seqno:
            raise SeqnoRangeError(f"rollback seqno {seqno} is outside 0..{part.high_seqno} for partition {partition}",
                                  partition=partition, seqno=seqno)
        # the undo works on the store alone: everything the queue holds goes there first (a
        # replica's queue grows only by the caller's own applies, so it stays flushed)
        self.persist_future({partition: part.high_seqno}).result()
        with self._lock:
            self._check_open()
            self._replica(partition)
            if part.queue.persisted != part.high_seqno:
                return UndoResult(Resync(seqno, "items arrived while the copy was being flushed for the undo"))
            result = undo_above(self._store, self._turn, partition, seqno, live_items=part.persisted_live,
                                purge_seqno=part.purge_seqno, max_cas=part.persisted_max_cas,
                                failover_log=part.failover_log)
            if isinstance(result.plan, Undo):
                # queue first, generation second (as ``reset_partition``): a flush round that read
                # the old queue skips it
                part.queue.reset(seqno)
                part.generation += 1
                part.live_items = part.persisted_live = result.live_items
                part.purge_seqno = result.purge_seqno
                part.failover_log = result.failover_log
                part.snapshots = ReplicaSnapshots.restored(SnapshotMark(seqno, seqno, seqno), seqno)
        if isinstance(result.plan, Undo):
            self._notify((partition,))
        return result

    def _activate(self, part: Partition, event: failover_policy.Event, *, staged: bool = False) -> None:
        log_ = failover_policy.apply(part.failover_log, event, self.config.failover_log_cap)
        store = self._store

        def put(txn: object) -> None:
            store.put_state(txn, part.id, PartitionState.ACTIVE)  # type: ignore[arg-type]
            store.put_failover(txn, part.id, log_)  # type: ignore[arg-type]

        if staged:  # under the writer lock, so before any write this state lets in
            store.stage(put)  # type: ignore[arg-type]
        else:
            store.write(put)
        part.failover_log = log_
        part.writes_stopped = False
        part.state = PartitionState.ACTIVE

    def _replica(self, partition: int) -> Partition:
        part = self._part(partition)
        if part.state is not PartitionState.REPLICA:
            raise NotReplica(f"partition {partition} is {part.state.value}, not a replica", partition=partition)
        return part

    def compact(self, *, purge_before_seqno: Mapping[int, int] | None = None,
                older_than_s: float | None = None) -> dict[int, int]:
        """Purge persisted tombstones and move purge seqnos; returns purge seqno per partition.

        A tombstone is purged when its seqno is below ``purge_before_seqno[p]`` (partitions not
        named are left alone when the mapping is given) and, if ``older_than_s`` is given, its
        CAS time is older than that.  With neither, every persisted tombstone is purged.
        """
        self._check_open()
        if purge_before_seqno is not None:
            for p in purge_before_seqno:
                self._part(p)
            targets = list(purge_before_seqno)
        else:
            targets = list(range(self.num_partitions))
        cutoff = time.time_ns() - int(older_than_s * 1e9) if older_than_s is not None else None
        out: dict[int, int] = {}
        for p in targets:
            bound = purge_before_seqno[p] if purge_before_seqno is not None else None
            part = self._parts[p]

            def should_purge(seqno: int, cas: int, bound: int | None = bound) -> bool:
                if bound is not None and seqno >= bound:
                    return False
                return cutoff is None or cas < cutoff

            highest = self._store.purge_tombstones(p, should_purge, part.purge_seqno)
            if highest > part.purge_seqno:
                part.purge_seqno = highest
            out[p] = part.purge_seqno
        return out

    def add_listener(self, callback: Callable[[Any], None], *, batch: bool = False) -> Callable[[], None]:
        """Call ``callback(partition)`` after writes are queued or a state changes there; with
        ``batch``, ``callback(partitions)`` once per write batch or change (an iterable of the
        partitions, not to be kept).  WHY ``batch``: a listener that hands the partitions to
        another thread (the streams' change hub) gets a write's partitions all at once, so the
        other thread never sees a write half announced (a delivery, and a pass, per part)."""
        with self._lock:
            if batch:
                self._batch_listeners = [*self._batch_listeners, callback]
            else:
                self._listeners = [*self._listeners, callback]

        def remove() -> None:
            with self._lock:
                self._listeners = [cb for cb in self._listeners if cb is not callback]
                self._batch_listeners = [cb for cb in self._batch_listeners if cb is not callback]

        return remove

    def add_persist_listener(self, callback: Callable[[int], None], *, eager: bool = True,
                             replicas_only: bool = False) -> Callable[[], None]:
        """Call ``callback(partition)`` on the flusher's thread after a flush round persisted
        more of that partition (its persisted seqno grew); the callback must be cheap.  WHY: a
        stream that may deliver only persisted writes waits for exactly this, and polling the
        persisted seqno would cost every waiting stream a wake-up per interval.

        ``eager``: someone waits on the news (a ``persisted`` stream), so rounds keep the flush
        interval's cadence while it is registered; a listener that only reports progress passes
        False and lets rounds gather (``engine.flusher.GATHER_S``).  A replica's acker is eager:
        the active's ``persist_majority`` writes wait for the copy's rounds.  It passes
        ``replicas_only``: it waits on replica partitions alone, so rounds keep the interval
        only while a replica partition has something to persist, and this node's own ``memory``
        writes still gather."""
        flusher = self._flusher
        counter = "eager_replica_listeners" if replicas_only else "eager_listeners"
        with self._lock:
            self._persist_listeners = [*self._persist_listeners, callback]
            if eager:
                setattr(flusher, counter, getattr(flusher, counter) + 1)
        removed = False

        def remove() -> None:
            nonlocal removed
            with self._lock:
                self._persist_listeners = [cb for cb in self._persist_listeners if cb is not callback]
                if eager and not removed:
                    setattr(flusher, counter, getattr(flusher, counter) - 1)
                removed = True

        return remove

    def engine_stats(self) -> dict[str, float]:
        parts = self._parts
        f = self._flusher
        return {
            "partitions": float(self.num_partitions),
            "queue_bytes": float(self._queue_bytes.bytes),
            "queue_depth": float(sum(p.queue.depth for p in parts)),
            "queue_memory_limit_bytes": float(self.config.queue_memory_limit_bytes),
            "high_seqno_total": float(sum(p.high_seqno for p in parts)),
            "persisted_seqno_total": float(sum(p.persisted_seqno for p in parts)),
            "writes_total": float(self.writes_total),
            "write_errors_total": float(self.write_errors_total),
            "backpressure_total": float(self.backpressure_total),
            "flush_count": float(f.flushes),
            "flush_rounds_total": float(f.rounds),
            "flush_gathered_rounds_total": float(f.gathered_rounds),
            "flush_items_total": float(f.items_flushed),
            "flush_bytes_total": float(f.bytes_flushed),
            "flush_seconds_total": f.flush_seconds,
            "flush_cpu_seconds_total": f.flush_cpu_seconds,
            "flush_items_per_s": f.items_flushed / f.flush_seconds if f.flush_seconds else 0.0,
            "flush_last_batch_items": float(f.last_batch_items),
            "flush_max_batch_items": float(f.max_batch_items),
            "flush_errors_total": float(f.errors),
            "flush_turn_handovers_total": float(f.turn_handovers),
            "flush_failing": 1.0 if f.fault is not None else 0.0,
            "persist_waiters": float(f.pending_waiters),
            "lmdb_commits_total": float(self._store.fsyncs),
            "lmdb_map_size": float(self._store.map_size),
            **lock_holds.figures(),
        }

    # ------------------------------------------------------------------ internals

    def _part(self, partition: int) -> Partition:
        if type(partition) is not int or not 0 <= partition < self.num_partitions:
            raise InvalidPartition(
                f"partition {partition!r} is outside 0..{self.num_partitions - 1}",
                field="partition", partition=partition if isinstance(partition, int) else None,
            )
        return self._parts[partition]

    def _raise_if_closed(self) -> None:
        """An LMDB error from a read that raced ``close()`` is reported as EngineClosed."""
        if self._closed:
            raise EngineClosed("engine closed during the read") from None

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("engine is closed")

    def _notify_persisted(self, partitions: list[int]) -> None:
        listeners = self._persist_listeners
        if not listeners:
            return
        for p in partitions:
            for callback in listeners:
                try:
                    callback(p)
                except Exception:
                    log.exception("engine persist listener failed")

    def _notify(self, partitions: object) -> None:
        self._flusher.note_change()
        for callback in self._batch_listeners:
            try:
                callback(partitions)
            except Exception:
                log.exception("engine listener failed")
        for p in partitions:  # type: ignore[attr-defined]
            for callback in self._listeners:
                try:
                    callback(p)
                except Exception:
                    log.exception("engine listener failed")
