"""Reading and encoding one partition's stream: the only stream code that touches the engine.

Theory of operation
-------------------
A ``PartitionCursor`` remembers how far a partition has been *encoded* for one connection and
holds the ``PartitionSnapshot`` being streamed.  ``PartitionCursor.produce`` runs in an executor
thread (never on the event loop): it takes a snapshot when it has none, then encodes the
snapshot's parts as DCP does: for each part a snapshot marker, then the items in seqno order in
batch frames (~64 KiB each), the last frame of the part flagged ``last``.  It stops when the
caller's byte budget is used up, so a connection never encodes more than it may soon send:
server memory per connection is the budget, not the backlog.

Cursor dropping (DCP's answer to slow consumers): a snapshot pins memory (a write-queue root
the flusher would otherwise free) or an LMDB read transaction (which pins pages and blocks map
growth).  When the connection has been blocked on its consumer for too long the adapter calls
``drop``: the snapshot is released and the next ``produce`` re-reads from the last encoded seqno.
If the drop happened mid-snapshot the new marker is a *continuation*: it repeats the open
snapshot's ``start`` with the new ``end``.  The consumer's partial snapshot thus simply grows;
its items are still the latest versions of their keys up to the new end, so the snapshot is
consistent once its ``last`` frame arrives, and a consumer that resumes in between rolls back to
the same ``start`` it would have rolled back to before.

End of stream: a bounded stream (``end_seqno``) ends after the complete snapshot containing
``end_seqno`` (not trimmed at it: a deduplicated snapshot cut in the middle is not a state that
existed), as DCP does.

Thread discipline: at most one executor job touches a cursor at a time (the connection awaits
each job before the next); the event loop reads only the plain integer fields for status.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from engine.types import Item

__all__ = ["Encoded", "Encoder", "PartitionCursor", "ProduceResult"]


@dataclass(slots=True)
class Encoded:
    """One WebSocket message ready to send.  ``str`` is a text frame, ``bytes`` a binary one."""

    data: str | bytes
    partition: int = -1
    #: highest seqno this message completes sending (for status and barrier vectors), or -1
    seqno: int = -1

    @property
    def size(self) -> int:
        return len(self.data)


class Encoder:
    """How snapshot markers, item batches and stream ends become messages (the codec)."""

    def marker(self, partition: int, start: int, end: int, source: str, purge_seqno: int) -> str | bytes:
        raise NotImplementedError

    def items(self, partition: int, items: list[Item], last: bool) -> str | bytes:
        raise NotImplementedError

    def stream_end(self, partition: int, reason: str, last_seqno: int) -> str | bytes:
        raise NotImplementedError


@dataclass(slots=True)
class ProduceResult:
    #: the partition's snapshot has been fully encoded (or there was nothing new)
    complete: bool
    #: ``end_seqno`` reached: the cursor is finished after these messages
    ended: bool
    #: nothing new was found: the visit found the partition idle
    idle: bool


class PartitionCursor:
    """One partition of one connection: position, bound and the snapshot being encoded."""

    def __init__(
        self,
        partition: int,
        start_seqno: int,
        snap_start: int,
        snap_end: int,
        end_seqno: int | None,
        *,
        frame_bytes: int = 64 * 1024,
        frame_items: int = 4096,
    ) -> None:
        self.partition = partition
        #: last seqno encoded (== the consumer's position once everything encoded is sent)
        self.last_seqno = start_seqno
        self.end_seqno = end_seqno
        self.snap_start = snap_start
        self.snap_end = snap_end
        #: a marker went out and its ``last`` frame did not (so a re-read continues it)
        self.open_snapshot = False
        self.high_seqno = start_seqno
        self.purge_seqno = 0
        self.finished = False
        #: the connection visited this stream at least once (its first pass ends with cycle_complete)
        self.visited = False
        self.drops = 0
        self.captured_at = 0.0
        self._frame_bytes = frame_bytes
        self._frame_items = frame_items
        self._snapshot: Any = None
        self._parts: deque[Any] = deque()
        self._part: Any = None
        self._batches: Iterator[list[Item]] | None = None
        self._lookahead: list[Item] | None = None

    # ------------------------------------------------------------------ loop-side queries
    @property
    def holding(self) -> bool:
        """True while a snapshot (memory root or LMDB transaction) is pinned by this cursor."""
        return self._snapshot is not None

    @property
    def bounded_done(self) -> bool:
        return self.end_seqno is not None and self.last_seqno >= self.end_seqno and not self.open_snapshot

    # ------------------------------------------------------------------ executor side
    def produce(self, snapshot_of: Callable[[int, int], Any], encoder: Encoder, budget: int,
                out: list[Encoded]) -> ProduceResult:
        """Append messages to ``out`` until ``budget`` bytes are used or the snapshot is complete."""
        p = self.partition
        if self.finished:
            return ProduceResult(True, True, True)
        if self.bounded_done:
            self._finish(encoder, out)
            return ProduceResult(True, True, True)
        if self._snapshot is None:
            snap = snapshot_of(p, self.last_seqno)
            self.high_seqno = snap.high_seqno
            self.purge_seqno = snap.purge_seqno
            if not snap.parts:
                _close(snap)
                return ProduceResult(True, False, True)
            self._snapshot = snap
            self._parts = deque(snap.parts)
            self.captured_at = time.monotonic()
        used = 0
        while used < budget:
            if self._batches is None:
                if not self._parts:
                    self._release()
                    if self.bounded_done:
                        self._finish(encoder, out)
                        return ProduceResult(True, True, False)
                    return ProduceResult(True, False, False)
                part = self._parts.popleft()
                batches = part.batches(self._frame_items, self._frame_bytes)
                first = next(batches, None)
                if first is None:
                    # Nothing left in this range (superseded or purged): move past it silently.
                    _close_iter(batches)
                    if not self.open_snapshot:
                        self.last_seqno = max(self.last_seqno, part.end)
                    continue
                start = self.snap_start if self.open_snapshot else part.start
                msg = encoder.marker(p, start, part.end, part.source, self.purge_seqno)
                out.append(Encoded(msg, p))
                used += len(msg)
                self.snap_start, self.snap_end = start, part.end
                self.open_snapshot = True
                self._part, self._batches, self._lookahead = part, batches, first
            batch = self._lookahead
            assert batch is not None
            self._lookahead = next(self._batches, None)
            last = self._lookahead is None
            data = encoder.items(p, batch, last)
            if last:
                _close_iter(self._batches)
                self._batches = None
                self.open_snapshot = False
                self.last_seqno = max(batch[-1].seqno, self._part.end)
                self._part = None
            else:
                self.last_seqno = batch[-1].seqno
            out.append(Encoded(data, p, self.last_seqno))
            used += len(data)
        if self._batches is None and not self._parts:
            self._release()
            if self.bounded_done:
                self._finish(encoder, out)
                return ProduceResult(True, True, False)
            return ProduceResult(True, False, False)
        return ProduceResult(False, False, False)

    def drop(self) -> bool:
        """Release the pinned snapshot (cursor dropping); the next ``produce`` re-reads from disk
        and memory after ``last_seqno``.  Returns True if something was released."""
        if self._snapshot is None:
            return False
        self._release()
        self.drops += 1
        return True

    def close(self) -> None:
        """Release everything (connection or stream closed)."""
        self._release()
        self.finished = True

    def _release(self) -> None:
        if self._batches is not None:
            _close_iter(self._batches)
        self._batches = None
        self._lookahead = None
        self._part = None
        self._parts = deque()
        snap, self._snapshot = self._snapshot, None
        if snap is not None:
            _close(snap)

    def _finish(self, encoder: Encoder, out: list[Encoded]) -> None:
        self.finished = True
        out.append(Encoded(encoder.stream_end(self.partition, "end_seqno_reached", self.last_seqno), self.partition))


def _close_iter(it: Iterator[Any]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def _close(snapshot: Any) -> None:
    close = getattr(snapshot, "close", None)
    if close is not None:
        close()
