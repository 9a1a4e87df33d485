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
        #: the scheduled callback waits in a writer job's inbox (``running_inbox``), not on the loop
        self._parked = False
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
        inbox = running_inbox(self._loop)
        with self._lock:
            self._dirty.update(partitions)
            if self._closed:
                return
            if self._scheduled:
                # a callback parked in a writer job's inbox runs when that job ends, which may be
                # long after a mark from another thread (a promotion, a replica's apply): such a
                # mark schedules a loop callback of its own (the later of the two delivers an
                # empty set)
                if not (self._parked and inbox is None):
                    return
                self._parked = False
            else:
                self._scheduled = True
                self._parked = inbox is not None
                self._first_mark = time.monotonic()
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
            self._scheduled = self._parked = False
            self.delay = time.monotonic() - self._first_mark
        self._deliver(dirty)
