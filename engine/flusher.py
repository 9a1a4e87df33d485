"""The flusher: moves queued items into LMDB with group commit, and wakes persist waiters.

One thread.  Each round takes, without the writer lock, every partition's queue root (an
immutable snapshot) and writes the unpersisted range of *all* partitions in one write
transaction (one fsync), bounded by ``flush_batch_items`` seqnos per round, starting at a
rotating partition so a hot partition cannot starve the others.  Only after the commit does
it take the writer lock to tell each queue what is now persisted (dropping index entries
that were not superseded meanwhile), and answers the persist waiters the round satisfied at
once, before it frees the persisted items and calls the persist listeners.

Rounds happen every ``flush_interval_ms`` while there is work, and at once when someone
waits for persistence (``persist_future`` kicks the thread): concurrent ``persist`` writes
therefore share fsyncs, because every waiter registered before a round starts is satisfied
by that round's single commit.  With nothing queued the thread sleeps until the engine reports
a change (``note_change``): an idle node's flusher neither wakes nor scans its partitions every
interval (a node's CPU with no writes, docs/benchmarks.md "Cluster").

A round builds its transaction while holding the engine's ``lmdb_turn`` and commits (page writes
and fsync) after releasing it, so writers run during the fsync but not during the build.

A failed round changes nothing in memory (items leave a queue only after a commit), so the next
successful round persists them.  ``engine.flush_health`` decides around a failure: the backoff
before the next attempt, one log line per state change, and the fault others read
(``Flusher.fault``).  While the disk is full, persist waiters get ``InsufficientStorage`` at once.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future

import lmdb

from engine.core.errors import DiskFull, EngineClosed, InsufficientStorage
from engine.storage.disk_errors import errno_of
from engine.flush_health import FaultKind, FlushFault, FlushHealth, classify
from engine.partition import Partition
from engine.storage.store import Store
from engine.core.types import Item, PartitionState

log = logging.getLogger(__name__)

#: the longest an idle flusher sleeps without being woken (a safety net, see ``_sleep_while_idle``)
IDLE_WAKE_S = 1.0

#: how long a round gathers changes when nobody waits for them to be persisted (no persist
#: waiter, no eager persist listener: ``Flusher.eager_listeners``), if longer than the interval.
#: WHY: each round is an LMDB commit and a hand-off to every persist listener, a fixed cost per
#: round whatever it carries; under a steady stream of small writes (a replicating node) the
#: interval's cadence made that most of the flusher's work (docs/benchmarks.md, "Cluster":
#: CPU per replicated bulk; Peers: "A node's CPU per small write request").  A waiter still gets
#: a round at once (``wait_for`` kicks), and the memory a gather holds stays bounded: past the
#: queues' memory limit a write is refused and kicks a round (``Backpressure``).  What a gather
#: puts at risk is what ``memory`` durability allows: the writes of its last tenth of a second
#: on a crash of the process (Redis's ``appendfsync everysec`` risks a second).
GATHER_S = 0.1

#: the least time between the starts of two rounds that a replica copy's changes alone ask for
#: (``Flusher.eager_replica_listeners``: a replica's acker).  WHY: a replica under a steady
#: stream has something to persist at every interval tick, so its rounds ran back to back, each
#: an LMDB commit plus a persisted ack to its active (docs/benchmarks.md, "Cluster": a
#: replicating node's CPU per bulk, thread by thread).  The copy's data is in memory already
#: (what ``majority`` counts); only a ``persist_majority`` write on its active waits for the
#: round, and it waits at most this long more under a steady stream and nothing more after a
#: quiet spell (the last round began long ago, so the next interval tick starts one).
REPLICA_ROUND_S = 0.05

REPLICA = PartitionState.REPLICA

#: a partition, its items to persist, the seqno they cover, and the partition's generation when read
_Work = tuple[Partition, list[Item], int, int]


def lmdb_turn() -> "LmdbTurn":
    """The lock that threads making many short LMDB calls in a row hold for the whole run of calls.

    WHY: py-lmdb releases the GIL around every call (``get``, ``put``, ``Cursor.replace``, even
    each key of ``getmulti``/``putmulti``).  When two threads each make thousands of such calls at
    once, the GIL changes hands at nearly every call, and each hand-off costs futex calls and a
    context switch: a by-key ``get`` beside one busy Python thread costs several times its CPU
    alone, and far more wall time waiting for the GIL (see docs/benchmarks.md, HTTP: the bulk
    breakdown's note on GIL hand-offs).  In the server, the writer thread's lookups and the
    flusher's replaces are such a pair; with this lock around each run, the other thread waits
    on the lock instead of on the GIL, so the GIL released around a call is mostly taken
    straight back (bulk ingest server CPU per mutation, ``bench.bench_http``).

    It is the innermost lock: no thread holding it waits for a lock that anyone waiting for it
    may hold.  It is never held across a commit, so a writer waits for at most one round's
    build (its bounded compaction steps included), never for its fsync; and the flusher hands it
    over inside a round's build whenever someone waits (``hand_over_turn``), so a writer waits
    for a slice of that build, not for all of it.
    """
    return LmdbTurn()


class LmdbTurn:
    """A ``threading.Lock`` that counts the threads blocked on it (``waiting``), so a long holder
    can tell when to step aside.  The count costs nothing while the lock is free: only a blocked
    acquire touches it."""

    __slots__ = ("_lock", "_guard", "waiting")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._guard = threading.Lock()
        #: threads blocked in ``acquire`` right now
        self.waiting = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        with self._guard:
            self.waiting += 1
        try:
            return self._lock.acquire(True, timeout)
        finally:
            with self._guard:
                self.waiting -= 1

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


#: items a round writes between two looks for a thread waiting for the LMDB turn: a slice of a
#: copy's build short enough that a write waiting for the turn is not held long (docs/benchmarks.md,
#: Cluster: "Flush rounds that hand over the LMDB turn")
TURN_SLICE_ITEMS = 2048

#: the longest the flusher waits, after releasing the turn, for a waiter to take it
HAND_OVER_MAX_S = 0.005
HAND_OVER_POLL_S = 0.0001


def hand_over_turn(turn: LmdbTurn) -> bool:
    """If a thread waits for ``turn`` (held by the caller), let it in and take the turn back
    after it; True if the turn changed hands.  WHY: a released ``threading.Lock`` is otherwise
    taken straight back by the thread that released it, as the waiter has yet to wake up."""
    if not turn.waiting:
        return False
    turn.release()
    deadline = time.perf_counter() + HAND_OVER_MAX_S
    while turn.waiting and not turn.locked() and time.perf_counter() < deadline:
        time.sleep(HAND_OVER_POLL_S)
    turn.acquire()
    return True


class Flusher:
    def __init__(
        self,
        store: Store,
        partitions: Sequence[Partition],
        writer_lock: threading.RLock,
        interval_s: float,
        batch_items: int,
        turn: LmdbTurn | None = None,
        max_retry_s: float = 2.0,
        gather_s: float | None = None,
    ) -> None:
        self._store = store
        self._turn = turn if turn is not None else lmdb_turn()
        self._partitions = partitions
        self._writer_lock = writer_lock
        self._interval = max(interval_s, 0.0005)
        #: a round's wait while nothing is urgent: never shorter than the interval
        self._gather = max(self._interval, GATHER_S if gather_s is None else gather_s)
        #: persist listeners someone waits on (e.g. a ``persisted``-visibility stream): while any
        #: is registered, rounds keep the interval's cadence (``Engine.add_persist_listener``)
        self._eager_listeners = 0
        #: a gathering wait is under way, and an eager listener registered during it (its setter)
        self._gathering = False
        self._eager_arrived = False
        #: persist listeners someone waits on for replica copies only (a replica's acker: its
        #: active's ``persist_majority`` writes wait for the copy's rounds): while any is
        #: registered, a round starts at the next interval tick once a replica partition has
        #: something to persist and the last round began ``REPLICA_ROUND_S`` ago, and gathers
        #: while only active partitions do (their ``memory`` writes wait for nobody; a
        #: ``persist`` write kicks)
        self.eager_replica_listeners = 0
        self._batch_items = max(batch_items, 1)
        self._kick = threading.Event()
        self._stop = threading.Event()  # wakes a backoff sleep, which kicks must not cut short
        #: wakes the idle sleep: a change (``note_change``), a kick or a stop
        self._wake = threading.Event()
        self._sleeping = False
        self.health = FlushHealth(max_retry_s)
        self._waiters_lock = threading.Lock()
        self._waiters: list[tuple[dict[int, int], Future[None]]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="upr-flusher", daemon=True)
        self._next_start = 0
        #: rounds looked for work (``flushes`` counts the ones that committed), and rounds whose
        #: wait gathered past the interval because nobody was waiting
        self.rounds = 0
        #: when the last round that found work began (``REPLICA_ROUND_S``)
        self._round_began = 0.0
        self.gathered_rounds = 0
        self.flushes = 0
        self.items_flushed = 0
        self.bytes_flushed = 0
        self.flush_seconds = 0.0
        self.flush_cpu_seconds = 0.0
        self.last_batch_items = 0
        self.max_batch_items = 0
        self.errors = 0
        #: times a round's build let a waiting thread take the LMDB turn
        self.turn_handovers = 0
        #: called on this thread after each committed round with the partitions it persisted
        #: (``Engine.add_persist_listener``); must be cheap and must not block
        self.on_persisted: Callable[[list[int]], None] | None = None

    def start(self) -> None:
        self._thread.start()

    @property
    def eager_listeners(self) -> int:
        return self._eager_listeners

    @eager_listeners.setter
    def eager_listeners(self, count: int) -> None:
        """A listener registering ends a gathering wait (which looks at nobody until it ends);
        the round then keeps the interval's cadence, as if the listener had been there before.
        The count is set before the flag is read and the gather raises the flag before it reads
        the count, so either the gather sees the listener or the listener ends the gather."""
        more = count > self._eager_listeners
        self._eager_listeners = count
        if more and self._gathering:
            self._eager_arrived = True
            self._kick.set()

    def kick(self) -> None:
        self._kick.set()
        self._wake.set()

    def note_change(self) -> None:
        """Something was queued (the engine calls it after every change it announces): an
        idle-sleeping thread starts its next round one interval from now."""
        if self._sleeping:
            self._sleeping = False
            self._wake.set()

    def wait_for(self, targets: Mapping[int, int]) -> Future[None]:
        """A future resolved once every ``persisted_seqno[p] >= targets[p]``."""
        future: Future[None] = Future()
        wanted = dict(targets)
        if self._satisfied(wanted):
            future.set_result(None)
            return future
        with self._waiters_lock:
            if self._stopping and not self._thread.is_alive():
                future.set_exception(EngineClosed("engine is closed"))
                return future
            fault = self.health.fault
            if fault is not None and fault.kind is FaultKind.NO_SPACE:
                # the next attempt is up to a backoff away and would fail like the last one
                future.set_exception(_not_persisted(wanted, fault))
                return future
            self._waiters.append((wanted, future))
        self._kick.set()
        return future

    def stop(self) -> None:
        """Flush everything queued, resolve waiters, and end the thread."""
        self._stopping = True
        self._kick.set()
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, []
        for wanted, future in waiters:
            if self._satisfied(wanted):
                future.set_result(None)
            else:
                future.set_exception(EngineClosed("engine closed before the write was persisted"))

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        more = False
        while True:
            if not more:
                if not self._kick.is_set():
                    self._sleep_while_idle()
                self._wait_for_round()
            self._kick.clear()
            try:
                more = self.flush_round()
            except Exception as exc:  # keep the thread alive; waiters learn of the failure
                self._round_failed(exc)
                if self._stopping:
                    return  # close() must not hang on a broken disk; it will not mark the store clean
                more = False
                self._stop.wait(self.health.retry_delay())
                continue
            self._resolve_waiters()
            if self._stopping and not more:
                # a round that began before the last writes could report "no more"; look again
                if any(p.queue.root.high > p.queue.persisted for p in self._partitions):
                    more = True
                    continue
                return

    def _wait_for_round(self) -> None:
        """While someone waits on this round (a persist waiter, an eager listener, a stop), wait
        the interval; otherwise gather for up to the gather time in one wait, which a kick (a
        persist waiter, backpressure, a stop, an eager listener registering) ends at once.

        WHY one wait and not a look per interval: under a steady stream of ``memory`` writes
        every look is a thread wake-up that takes the GIL from the event loop (docs/benchmarks.md,
        Peers, "A node's CPU per small write request").  Only a replica's acker
        (``eager_replica_listeners``) still has the gather looked at once per interval, since
        nothing kicks when a replica partition's change arrives."""
        kick = self._kick
        if self._gather <= self._interval or self._urgent():
            kick.wait(self._interval)
            return
        if not any(p.queue.root.high > p.queue.persisted for p in self._partitions):
            return  # an idle look (``IDLE_WAKE_S``): nothing to gather for
        deadline = time.monotonic() + self._gather
        if not self.eager_replica_listeners:
            self._eager_arrived = False  # a late flag of an earlier gather
            self._gathering = True
            try:
                if self._urgent():
                    kick.wait(self._interval)
                    return
                self.gathered_rounds += 1
                kick.wait(self._gather)
            finally:
                self._gathering = False
            if self._eager_arrived:  # not a kick for a round now: the interval's cadence from here
                self._eager_arrived = False
                kick.clear()
                if not (self._waiters or self._stopping):  # a waiter's kick cleared above is seen here
                    kick.wait(self._interval)
            return
        gathered = False
        while not (self._urgent() or self._replica_pending()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            gathered = True
            if kick.wait(min(left, self._interval)):
                break
        if gathered:
            self.gathered_rounds += 1

    def _urgent(self) -> bool:
        """Someone waits on the next round: a persist waiter, an eager listener, a stop."""
        return bool(self._waiters or self.eager_listeners or self._stopping)

    def _replica_pending(self) -> bool:
        """Whether a replica partition has queued items not yet persisted and the last round
        began at least ``REPLICA_ROUND_S`` ago (looked at once per interval while a round
        gathers)."""
        if time.monotonic() - self._round_began < REPLICA_ROUND_S:
            return False
        return any(p.state is REPLICA and p.queue.root.high > p.queue.persisted for p in self._partitions)

    def _sleep_while_idle(self) -> None:
        """Sleep while no partition has anything to persist.  The flag is raised before the
        queues are looked at and a writer publishes before it reads the flag, so a write is
        either seen here or wakes the sleep.  The timeout only bounds what a change announced
        by no one would wait."""
        self._sleeping = True
        if self._stopping or any(p.queue.root.high > p.queue.persisted for p in self._partitions):
            self._sleeping = False
            return
        self._wake.wait(IDLE_WAKE_S)
        self._sleeping = False
        self._wake.clear()

    def flush_round(self) -> bool:
        """One group commit; returns True if work was left over for another round."""
        self.rounds += 1
        round_began = time.monotonic()
        work: list[_Work] = []
        budget = self._batch_items
        parts = self._partitions
        n = len(parts)
        start = self._next_start
        more = False
        for i in range(n):
            part = parts[(start + i) % n]
            queue = part.queue
            if queue.root.high <= queue.persisted:
                continue
            if budget <= 0:
                more = True
                break
            # the generation is read before the queue: a reset between the two reads then
            # shows as a changed generation, never as old items tagged with the new one
            generation = part.generation
            items, upto = queue.unpersisted(budget)
            budget -= upto - queue.persisted
            work.append((part, items, upto, generation))
            if upto < queue.root.high:
                more = True
        self._next_start = (start + 1) % n
        if not work:
            return False
        self._round_began = round_began  # an idle look is no round to pace from
        began = time.perf_counter()
        began_cpu = time.thread_time()
        store = self._store

        turn = self._turn

        def write(txn: object) -> list[tuple[int, int, int]]:
            out = []
            persisted_rows: list[tuple[int, int, int, int]] = []
            # held for the build, handed over between slices to whoever waits for it (the items
            # written so far stay invisible to them until the commit), released before
            # ``store.write`` commits
            with turn:
                for i, (part, items, upto, generation) in enumerate(work):
                    if i:
                        self.turn_handovers += hand_over_turn(turn)
                    if part.generation != generation:  # emptied since it was read: nothing of it is valid
                        out.append((0, 0, 0))
                        continue
                    delta = nbytes = 0
                    for lo in range(0, len(items), TURN_SLICE_ITEMS):
                        if lo:
                            self.turn_handovers += hand_over_turn(turn)
                        hi = lo + TURN_SLICE_ITEMS
                        d, b = store.flush_items(txn, part.id, items[lo:hi] if lo or hi < len(items) else items,
                                                 compact=hi >= len(items))  # type: ignore[arg-type]
                        delta += d
                        nbytes += b
                    live = part.persisted_live + delta
                    max_cas = max(part.persisted_max_cas, items[-1].cas) if items else part.persisted_max_cas
                    persisted_rows.append((part.id, upto, live, max_cas))
                    if part.snapshots.marks:  # a replica: what survives a crash is the range at ``upto``
                        store.put_snapshot(txn, part.id, part.snapshots.at(upto))  # type: ignore[arg-type]
                    out.append((live, max_cas, nbytes))
                store.put_persisted_many(txn, persisted_rows)  # type: ignore[arg-type]
            return out

        results = store.write(write)
        count = 0
        garbage = []
        persisted: list[int] = []
        with self._writer_lock:
            for (part, items, upto, generation), (live, max_cas, _nbytes) in zip(work, results):
                if part.generation != generation:
                    continue
                persisted.append(part.id)
                part.persisted_live = live
                part.persisted_max_cas = max_cas
                garbage.append(part.queue.mark_persisted(items, upto))
                if part.snapshots.marks:
                    part.snapshots = part.snapshots.persisted(upto)
                count += len(items)
        # answered once the queues say persisted (what a waiter's caller reads next), before the
        # persisted items are freed and the persist listeners run: neither is the waiter's business
        self._resolve_waiters()
        nbytes = sum(r[2] for r in results)
        del garbage, work  # freeing the persisted items happens here, outside the writer lock
        if self.on_persisted is not None and persisted:
            try:
                self.on_persisted(persisted)
            except Exception:  # a listener's fault must not stop flushing
                log.exception("persist listener failed")
        self.flushes += 1
        self.items_flushed += count
        self.bytes_flushed += nbytes
        self.last_batch_items = count
        self.max_batch_items = max(self.max_batch_items, count)
        self.flush_seconds += time.perf_counter() - began
        self.flush_cpu_seconds += time.thread_time() - began_cpu
        if self.health.fault is not None:
            queued = sum(p.queue.depth for p in parts)
            recovered = self.health.succeeded(time.monotonic(), count, nbytes, queued)
            if recovered is not None:
                log.warning("%s", recovered.message())
        return more

    def _round_failed(self, exc: Exception) -> None:
        """Record the failure, log it if the state changed, and answer the waiters."""
        self.errors += 1
        kind = classify(errno_of(exc), _free_bytes(self._store))
        pending = {p.id: (p.queue.persisted + 1, p.queue.root.high)
                   for p in self._partitions if p.queue.root.high > p.queue.persisted}
        change = self.health.failed(time.monotonic(), kind, _reason(exc), pending)
        if change is not None:
            # a traceback helps only with an unexpected error, and once per state change
            log.error("%s", change.message(), exc_info=exc if kind is FaultKind.WRITE_ERROR else None)
        self._fail_waiters(exc, self.health.fault if kind is FaultKind.NO_SPACE else None)

    # ------------------------------------------------------------------ waiters

    def _satisfied(self, wanted: Mapping[int, int]) -> bool:
        parts = self._partitions
        return all(parts[p].queue.persisted >= seqno for p, seqno in wanted.items())

    def _resolve_waiters(self) -> None:
        if not self._waiters:
            return
        with self._waiters_lock:
            done: list[Future[None]] = []
            left: list[tuple[dict[int, int], Future[None]]] = []
            for wanted, future in self._waiters:
                if self._satisfied(wanted):
                    done.append(future)
                else:
                    left.append((wanted, future))
            if not done:
                return
            self._waiters = left
        for future in done:
            if not future.done():
                future.set_result(None)
        if left:
            self._kick.set()

    def _fail_waiters(self, exc: BaseException, fault: FlushFault | None = None) -> None:
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, []
        for wanted, future in waiters:
            if not future.done():
                future.set_exception(_not_persisted(wanted, fault) if fault is not None else exc)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def fault(self) -> FlushFault | None:
        """The current flush fault, or None while flushing works."""
        return self.health.fault

    @property
    def pending_waiters(self) -> int:
        return len(self._waiters)


def _not_persisted(wanted: Mapping[int, int], fault: FlushFault) -> InsufficientStorage:
    """The error a persist waiter gets while the disk is full: the write is applied, queued, and
    will be persisted by the flusher once space returns."""
    shown = sorted(wanted.items())
    where = ", ".join(f"partition {p} up to seqno {s}" for p, s in shown[:8])
    if len(shown) > 8:
        where += f" and {len(shown) - 8} more partition(s)"
    only = next(iter(wanted.items())) if len(wanted) == 1 else None
    return InsufficientStorage(
        f"{where}: applied and queued in memory, but not persisted: {fault.describe()}; "
        "it will be persisted once space returns",
        partition=only[0] if only else None, seqno=only[1] if only else None, unpersisted=dict(wanted),
    )


def _free_bytes(store: Store) -> int | None:
    try:
        st = os.statvfs(store.env.path())
    except (OSError, lmdb.Error):
        return None
    return st.f_bavail * st.f_frsize


def _reason(exc: BaseException) -> str:
    """What the operator reads: LMDB's own words (``Store.write`` wraps a refused commit in
    ``DiskFull``, whose advice to retry is for a caller, not for the flusher that retries itself)."""
    if isinstance(exc, DiskFull) and exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {exc}"
