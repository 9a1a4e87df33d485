"""The engine's writer thread, and the way its results get back to the event loop.

WHY not a one-thread ``ThreadPoolExecutor``: per request it builds a work item and a
``concurrent.futures.Future`` (a condition variable and its lock), and hands the result back
with one ``call_soon_threadsafe`` per request (a write to the loop's self-pipe and a loop
wake-up each); ``ThreadPoolExecutor.submit`` alone was 7–9 % of a replicating node's GIL samples
(docs/benchmarks.md, Cluster, "Replication path per wake-up").  Here a job is a plain callable
put on a ``queue.SimpleQueue`` (C, no Python-level lock); the thread takes every job queued when
it wakes and runs them back to back (concurrent small bulks share one thread wake-up), and the
results of that whole run reach the loop through ``LoopInbox``: one loop wake-up per run, not
per job.

Order: jobs run in submission order, one at a time (the engine serialises writes anyway, and
arrival order is the order seqnos are handed out).  LMDB stays off the event loop: the loop only
queues jobs and settles futures.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["LoopInbox", "WriterThread", "running_inbox"]

log = logging.getLogger(__name__)
_STOP = object()
#: within a run, results already posted are woken once this much time has passed, so a long job
#: does not hold back the answers of the short ones that ran before it
_RUN_WAKE_S = 0.002


#: the inbox of the job running on this thread (set on a writer thread only)
_running = threading.local()


def running_inbox(loop: asyncio.AbstractEventLoop) -> "LoopInbox | None":
    """The inbox of the writer job running on this thread, if it answers to ``loop``: a callback
    posted there reaches the loop in the same wake-up as the job's own result, which the writer
    thread asks for as soon as the job ends.

    WHY: a write's change notification (the streams' wake) and its answer otherwise wake the
    loop once each, from the same thread a few microseconds apart; each wake-up is a self-pipe
    write and a GIL hand-over (docs/benchmarks.md, Peers, "A node's CPU per small write
    request").  Posted before the job's result, the notification still runs first, so a stream
    is told of a write before the writer is answered."""
    inbox = getattr(_running, "inbox", None)
    return inbox if inbox is not None and inbox.loop is loop else None


class LoopInbox:
    """Callbacks posted from any thread, run on ``loop`` in one loop callback per burst.

    ``post`` queues ``fn(*args)``; ``wake`` schedules the loop callback unless one is pending.
    The flag is cleared *before* the queue is drained, and a poster appends *before* it checks
    the flag, so a callback posted while a drain runs is either taken by that drain or wakes
    another one: none is left behind."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._calls: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._scheduled = False
        self.wakes = 0  # loop wake-ups asked for (tests, benchmarks)

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        self._calls.append((fn, args))

    def wake(self) -> None:
        if self._scheduled or not self._calls:
            return
        self._scheduled = True
        self.wakes += 1
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody waits any more
            self._scheduled = False

    def post_and_wake(self, fn: Callable[..., None], *args: Any) -> None:
        self._calls.append((fn, args))
        self.wake()

    def _drain(self) -> None:
        self._scheduled = False
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception:  # a bug in one callback must not strand the answers queued after it
                log.exception("loop inbox callback failed")


class WriterThread:
    """One daemon thread running submitted jobs in order; see the module docstring.

    ``submit(job, inbox)``: ``job()`` runs on the thread and may ``inbox.post`` its results;
    after each run of jobs the thread wakes every inbox its jobs named, once."""

    def __init__(self, name: str = "upr-writer") -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self.runs = 0  # thread wake-ups that found work
        self.jobs = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], inbox: LoopInbox) -> None:
        if self._closed:
            raise RuntimeError("the writer thread is shut down")
        self._jobs.put((job, inbox))

    def shutdown(self) -> None:
        """Run what is queued, then stop; waits for the thread."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _loop(self) -> None:
        get, take = self._jobs.get, self._jobs.get_nowait
        running = _running
        while True:
            run = [get()]
            while True:
                try:
                    run.append(take())
                except queue.Empty:
                    break
            self.runs += 1
            stop = False
            inboxes: list[LoopInbox] = []
            clock = time.perf_counter
            since = clock()
            for entry in run:
                if entry is _STOP:
                    stop = True
                    continue
                job, inbox = entry
                self.jobs += 1
                running.inbox = inbox
                try:
                    job()
                except BaseException:  # a job settles its own errors: this is a bug, not the thread's end
                    log.exception("writer job failed")
                finally:
                    running.inbox = None
                if inbox not in inboxes:
                    inboxes.append(inbox)
                if len(run) > 1 and clock() - since > _RUN_WAKE_S:
                    for inbox in inboxes:
                        inbox.wake()
                    inboxes.clear()
                    since = clock()
            for inbox in inboxes:
                inbox.wake()
            if stop:
                return
