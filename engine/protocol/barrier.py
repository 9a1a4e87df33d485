"""Barrier cookies: UPR's consistent cut across partitions, the feature DCP never shipped.

Theory of operation
-------------------
A client sends a cookie; the server returns it once every partition it streams has been
*visited after the cookie arrived*.  A visit is the stream loop's unit of work on one partition:

    token = tracker.begin_visit(p)   # when the loop takes p's snapshot / high-seqno reading
    ...send everything up to that reading (or nothing: the partition was idle)...
    tracker.end_visit(p, token)

Each ``begin_visit`` draws the next value of a connection-wide visit counter; each cookie is
tagged with the counter's value when it arrived.  So "visit began after the cookie" is simply
``token > tag``, and a cookie is released once, for every streaming partition, the newest
*completed* visit has a token above the cookie's tag.

Why this gives the guarantee (every mutation acknowledged to a writer before the cookie was
sent is delivered before the cookie comes back): such a mutation was in the engine before the
cookie arrived, hence before any visit that began after it took its reading; that visit sends
everything up to its reading before it ends, and the cookie is released only after those ends.

Cookies are kept in arrival order and tags never decrease, so when a cookie is satisfied every
older one is too: ``release`` pops from the front of the FIFO.  Partitions whose stream ended or
was refused leave the streaming set (``stream_stopped``) and no longer hold cookies back; with no
streaming partition at all, every pending cookie is released at once.

Transitions (per pending cookie c with tag t, per streaming partition p):

    event                          effect on c
    -----------------------------  -------------------------------------------------------
    begin_visit(p) -> token        nothing yet (token > t if the visit began after c)
    end_visit(p, token), token > t p counts as done for c
    end_visit(p, token), token <= t  nothing: the visit's reading may predate c
    stream_stopped(p)              p no longer needed by any cookie
    stream_started(p)              p needed by every pending cookie (its first visit is after)
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.protocol.errors import ErrorCode, ProtocolError

__all__ = ["BarrierTracker", "PendingCookie"]


@dataclass(frozen=True, slots=True)
class PendingCookie:
    cookie: str
    tag: int  # visit counter when the cookie arrived


class BarrierTracker:
    """FIFO of pending cookies plus per-partition visit bookkeeping for one connection."""

    __slots__ = ("_completed", "_counter", "_max_pending", "_names", "_pending", "_started", "_streaming")

    def __init__(self, max_pending: int = 1024) -> None:
        self._max_pending = max_pending
        self._pending: deque[PendingCookie] = deque()
        self._names: set[str] = set()
        self._counter = 0
        self._streaming: set[int] = set()
        self._started: dict[int, int] = {}  # partition -> token of its newest begin_visit
        self._completed: dict[int, int] = {}  # partition -> token of its newest completed visit

    # ------------------------------------------------------------------ cookies

    def add(self, cookie: str) -> None:
        """Queue a cookie; a cookie already pending on this connection is a protocol error."""
        if cookie in self._names:
            raise ProtocolError(
                ErrorCode.DUPLICATE_COOKIE,
                f"cookie {cookie!r} is already pending on this connection",
                field="cookie",
                close_code=None,
            )
        if len(self._pending) >= self._max_pending:
            raise ProtocolError(
                ErrorCode.TOO_MANY_COOKIES,
                f"{len(self._pending)} cookies already pending; the limit is {self._max_pending}",
                field="cookie",
                close_code=None,
            )
        self._pending.append(PendingCookie(cookie, self._counter))
        self._names.add(cookie)

    def release(self) -> list[str]:
        """Pop and return, oldest first, every cookie whose barrier is now complete."""
        out: list[str] = []
        while self._pending and self._satisfied(self._pending[0].tag):
            done = self._pending.popleft()
            self._names.discard(done.cookie)
            out.append(done.cookie)
        return out

    def _satisfied(self, tag: int) -> bool:
        completed = self._completed
        return all(completed.get(p, 0) > tag for p in self._streaming)

    @property
    def pending(self) -> tuple[str, ...]:
        return tuple(c.cookie for c in self._pending)

    # ------------------------------------------------------------------ streams and visits

    def stream_started(self, partition: int) -> None:
        self._streaming.add(partition)

    def stream_stopped(self, partition: int) -> None:
        """The partition's stream ended or was refused: it counts as done for every cookie."""
        self._streaming.discard(partition)
        self._started.pop(partition, None)
        self._completed.pop(partition, None)

    def begin_visit(self, partition: int) -> int:
        """The loop takes ``partition``'s reading now; returns the visit's token."""
        self._counter += 1
        self._started[partition] = self._counter
        return self._counter

    def end_visit(self, partition: int, token: int) -> None:
        """Everything up to the reading of visit ``token`` was sent (or there was nothing)."""
        if partition in self._streaming and token > self._completed.get(partition, 0):
            self._completed[partition] = token

    def needs_visit(self, partition: int) -> bool:
        """True if a pending cookie waits on ``partition`` and no visit that counts has begun."""
        return bool(self._pending) and self._started.get(partition, 0) <= self._pending[-1].tag

    @property
    def visit_counter(self) -> int:
        return self._counter
