"""Partitions marked from any thread, handed to the event loop in one callback per burst.

WHY: the writer thread (change notifications) and the flusher thread (persisted seqnos) signal
partitions far more often than a loop can afford callbacks.  A mark adds the partition to a set
under a lock and schedules *at most one* loop callback until that callback has run; the callback
takes the whole set.  A busy thread therefore costs the loop one callback per loop iteration,
whatever its rate.  ``call_soon_threadsafe`` appends to the ready queue at once, so a mark made
before a thread returns is delivered before anything the loop reads after that return.  A mark
made by a writer-thread job goes into that job's ``LoopInbox`` instead (``running_inbox``): it
reaches the loop in the wake-up that carries the job's answer, ahead of it.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable

from app.writer_thread import running_inbox

__all__ = ["CoalescedPartitions"]


class CoalescedPartitions:
    """``mark(p)`` from any thread; ``deliver(partitions)`` runs on ``loop`` once per burst."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[frozenset[int]], None]) -> None:
        self._loop = loop
        self._deliver = deliver
        self._lock = threading.Lock()
        self._dirty: set[int] = set()
        self._scheduled = False
        self._closed = False
        self._first_mark = 0.0
        #: how long the last delivered burst waited: from its first mark to the callback running
        #: (the loop's queueing; read by ``deliver`` to tell a busy loop from an idle one)
        self.delay = 0.0

    def mark(self, partition: int) -> None:
        self.mark_many((partition,))

    def mark_many(self, partitions: Iterable[int]) -> None:
        """``mark`` for each of ``partitions`` at once: one lock, at most one callback, and the
        loop never takes half of them (the callback is scheduled after all are added)."""
        with self._lock:
            self._dirty.update(partitions)
            if self._scheduled or self._closed:
                return
            self._scheduled = True
            self._first_mark = time.monotonic()
        inbox = running_inbox(self._loop)
        if inbox is not None:  # marked by a writer job: woken with the job's answer, before it
            inbox.post(self._run)
            return
        try:
            self._loop.call_soon_threadsafe(self._run)
        except RuntimeError:  # the loop is closed: the server is going away
            pass

    def close(self) -> bool:
        """Deliver nothing more; True the first time (so the owner releases what it holds once)."""
        with self._lock:
            first, self._closed = not self._closed, True
        return first

    @property
    def closed(self) -> bool:
        return self._closed

    def _run(self) -> None:
        with self._lock:
            dirty, self._dirty = frozenset(self._dirty), set()
            self._scheduled = False
            self.delay = time.monotonic() - self._first_mark
        self._deliver(dirty)
