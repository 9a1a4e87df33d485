"""The flusher: moves queued items into LMDB with group commit, and wakes persist waiters.

One thread.  Each round takes, without the writer lock, every partition's queue root (an
immutable snapshot) and writes the unpersisted range of *all* partitions in one write
transaction (one fsync), bounded by ``flush_batch_items`` seqnos per round, starting at a
rotating partition so a hot partition cannot starve the others.  Only after the commit does
it take the writer lock to tell each queue what is now persisted (dropping index entries
that were not superseded meanwhile).

Rounds happen every ``flush_interval_ms`` while there is work, and at once when someone
waits for persistence (``persist_future`` kicks the thread): concurrent ``persist`` writes
therefore share fsyncs, because every waiter registered before a round starts is satisfied
by that round's single commit.

A round builds its transaction while holding the engine's ``lmdb_turn`` and commits (page writes
and fsync) after releasing it, so writers run during the fsync but not during the build.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

from engine.core.errors import EngineClosed
from engine.partition import Partition
from engine.storage.store import Store
from engine.core.types import Item

log = logging.getLogger(__name__)

_Work = tuple[Partition, list[Item], int]
_ERROR_BACKOFF_S = 0.1


def lmdb_turn() -> threading.Lock:
    """The lock that threads making many short LMDB calls in a row hold for the whole run of calls.

    WHY: py-lmdb releases the GIL around every call (``get``, ``put``, ``Cursor.replace``, even
    each key of ``getmulti``/``putmulti``).  When two threads each make thousands of such calls at
    once, the GIL changes hands at nearly every call, and each hand-off costs futex calls and a
    context switch.  Measured on the 2-core VM: a by-key ``get`` costs 0.23 µs of CPU alone and
    1.4 µs beside one busy Python thread (about 150 µs of wall time each, waiting for the GIL).
    In the server, the writer thread's lookups and the flusher's replaces were such a pair; with
    this lock around each run, the other thread waits on the lock instead of on the GIL, so the
    GIL released around a call is mostly taken straight back
    (bulk ingest, ``bench.bench_http``: 7.7-8.0 → 6.2-6.4 µs of server CPU per mutation).

    It is the innermost lock: no thread holding it waits for a lock that anyone waiting for it
    may hold.  It is never held across a commit, so a writer waits for at most one round's
    build (its bounded compaction steps included), never for its fsync.
    """
    return threading.Lock()


class Flusher:
    def __init__(
        self,
        store: Store,
        partitions: Sequence[Partition],
        writer_lock: threading.RLock,
        interval_s: float,
        batch_items: int,
        turn: threading.Lock | None = None,
    ) -> None:
        self._store = store
        self._turn = turn if turn is not None else lmdb_turn()
        self._partitions = partitions
        self._writer_lock = writer_lock
        self._interval = max(interval_s, 0.0005)
        self._batch_items = max(batch_items, 1)
        self._kick = threading.Event()
        self._waiters_lock = threading.Lock()
        self._waiters: list[tuple[dict[int, int], Future[None]]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="upr-flusher", daemon=True)
        self._next_start = 0
        self.flushes = 0
        self.items_flushed = 0
        self.bytes_flushed = 0
        self.flush_seconds = 0.0
        self.flush_cpu_seconds = 0.0
        self.last_batch_items = 0
        self.max_batch_items = 0
        self.errors = 0

    def start(self) -> None:
        self._thread.start()

    def kick(self) -> None:
        self._kick.set()

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
            self._waiters.append((wanted, future))
        self._kick.set()
        return future

    def stop(self) -> None:
        """Flush everything queued, resolve waiters, and end the thread."""
        self._stopping = True
        self._kick.set()
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
                self._kick.wait(self._interval)
            self._kick.clear()
            try:
                more = self.flush_round()
            except Exception as exc:  # keep the thread alive; waiters learn of the failure
                self.errors += 1
                log.exception("flush failed")
                self._fail_waiters(exc)
                if self._stopping:
                    return  # close() must not hang on a broken disk; it will not mark the store clean
                more = False
                time.sleep(min(self._interval, _ERROR_BACKOFF_S))  # retry soon, but do not spin
                continue
            self._resolve_waiters()
            if self._stopping and not more:
                # a round that began before the last writes could report "no more"; look again
                if any(p.queue.root.high > p.queue.persisted for p in self._partitions):
                    more = True
                    continue
                return

    def flush_round(self) -> bool:
        """One group commit; returns True if work was left over for another round."""
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
            items, upto = queue.unpersisted(budget)
            budget -= upto - queue.persisted
            work.append((part, items, upto))
            if upto < queue.root.high:
                more = True
        self._next_start = (start + 1) % n
        if not work:
            return False
        began = time.perf_counter()
        began_cpu = time.thread_time()
        store = self._store

        def write(txn: object) -> list[tuple[int, int, int]]:
            out = []
            with self._turn:  # released before ``store.write`` commits
                for part, items, upto in work:
                    delta, nbytes = store.flush_items(txn, part.id, items)  # type: ignore[arg-type]
                    live = part.persisted_live + delta
                    max_cas = max(part.persisted_max_cas, items[-1].cas) if items else part.persisted_max_cas
                    store.put_persisted(txn, part.id, upto, live, max_cas)  # type: ignore[arg-type]
                    out.append((live, max_cas, nbytes))
            return out

        results = store.write(write)
        count = 0
        garbage = []
        with self._writer_lock:
            for (part, items, upto), (live, max_cas, _nbytes) in zip(work, results):
                part.persisted_live = live
                part.persisted_max_cas = max_cas
                garbage.append(part.queue.mark_persisted(items, upto))
                count += len(items)
        nbytes = sum(r[2] for r in results)
        del garbage, work  # freeing the persisted items happens here, outside the writer lock
        self.flushes += 1
        self.items_flushed += count
        self.bytes_flushed += nbytes
        self.last_batch_items = count
        self.max_batch_items = max(self.max_batch_items, count)
        self.flush_seconds += time.perf_counter() - began
        self.flush_cpu_seconds += time.thread_time() - began_cpu
        return more

    # ------------------------------------------------------------------ waiters

    def _satisfied(self, wanted: Mapping[int, int]) -> bool:
        parts = self._partitions
        return all(parts[p].queue.persisted >= seqno for p, seqno in wanted.items())

    def _resolve_waiters(self) -> None:
        if not self._waiters:
            return
        with self._waiters_lock:
            done = [(w, f) for w, f in self._waiters if self._satisfied(w)]
            if not done:
                return
            self._waiters = [(w, f) for w, f in self._waiters if not self._satisfied(w)]
        for _wanted, future in done:
            if not future.done():
                future.set_result(None)
        if self._waiters:
            self._kick.set()

    def _fail_waiters(self, exc: BaseException) -> None:
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, []
        for _wanted, future in waiters:
            if not future.done():
                future.set_exception(exc)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def pending_waiters(self) -> int:
        return len(self._waiters)
