"""The consumer position state machine of one partition (sans-I/O: fed events, never does I/O).

Theory of operation
-------------------
The position moves only when the consumer has *processed* something (the handler returned, or the
iterator was asked for the next event), never when a frame was merely *received*: java-dcp-client's
deprecated session state tracked received events and silently skipped mutations after a crash
(dcp.md §3.4).  The consumer adapter therefore calls these methods after processing.

Three states, as DCP consumers track them (java-dcp-client ``PartitionState``, JDCP-241):

    AT_BOUNDARY   the consumer holds a whole snapshot: offset = (uuid, end, start, end)
    PENDING       a snapshot marker arrived but none of its items was processed yet; the marker is
                  *not* promoted, so the offset still names the previous snapshot (JDCP-241)
    IN_SNAPSHOT   some items of the snapshot were processed: offset = (uuid, last seqno, start, end),
                  a partial snapshot, which the server may answer with a rollback to ``start``
                  because deduplicated items of a partial snapshot are not a state that existed

    state          marker          item             snapshot_end     rollback / resume
    AT_BOUNDARY    -> PENDING      violation        violation        -> AT_BOUNDARY
    PENDING        -> PENDING (*)  -> IN_SNAPSHOT   -> AT_BOUNDARY   -> AT_BOUNDARY / RESUMED
    IN_SNAPSHOT    violation (**)  -> IN_SNAPSHOT   -> AT_BOUNDARY   -> AT_BOUNDARY / RESUMED
    RESUMED        -> PENDING      violation        violation        ...

(*) a marker replacing a marker that brought no items is tolerated.  (**) except a continuation
marker (start = seqno + 1, end >= snap_end): the server re-read the rest of the open snapshot after
releasing it (cursor dropping); the snapshot's end grows and it stays IN_SNAPSHOT.  RESUMED is IN_SNAPSHOT after a
reconnect: the partial range is kept for the stream request, and the server opens a new snapshot.

Invariant after every transition: ``snap_start <= seqno <= snap_end`` (DCP's ERANGE rule, the
cause of java-dcp-client#41), so ``offset()`` is always a request the server accepts.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence

from engine.core.types import FailoverEntry

from .errors import ProtocolViolation
from .offset import StreamOffset

__all__ = ["PositionState", "PartitionPosition"]


class PositionState(str, enum.Enum):
    AT_BOUNDARY = "at_boundary"
    PENDING = "pending"
    IN_SNAPSHOT = "in_snapshot"
    RESUMED = "resumed"


class PartitionPosition:
    """Mutable position of one partition; see the module docstring for the transition table."""

    __slots__ = ("partition", "uuid", "seqno", "snap_start", "snap_end", "failover_log", "pending", "state",
                 "last_complete")

    def __init__(
        self,
        partition: int,
        offset: StreamOffset | None = None,
        failover_log: Sequence[FailoverEntry] = (),
    ) -> None:
        offset = offset or StreamOffset.beginning()
        self.partition = partition
        self.uuid = offset.uuid
        self.seqno = offset.seqno
        self.snap_start = offset.snap_start
        self.snap_end = offset.snap_end
        self.failover_log: tuple[FailoverEntry, ...] = tuple(failover_log)
        self.pending: tuple[int, int] | None = None
        self.state = PositionState.AT_BOUNDARY if offset.complete else PositionState.RESUMED
        #: (start, end) of the last snapshot the consumer processed completely.
        self.last_complete: tuple[int, int] = (offset.snap_start, offset.snap_end) if offset.complete else (0, 0)

    # ------------------------------------------------------------------ queries
    def offset(self) -> StreamOffset:
        """What to put in the next stream request: never claims a partial snapshot complete."""
        return StreamOffset(self.uuid, self.seqno, self.snap_start, self.snap_end)

    def __repr__(self) -> str:
        return (f"PartitionPosition(p={self.partition}, {self.state.value}, uuid={self.uuid}, seqno={self.seqno}, "
                f"snap=[{self.snap_start},{self.snap_end}], pending={self.pending})")

    # ------------------------------------------------------------------ events
    def snapshot_marker(self, start: int, end: int) -> None:
        if self.state is PositionState.IN_SNAPSHOT:
            if start == self.seqno + 1 and end >= self.snap_end:
                # (**) a continuation: the server released the open snapshot (cursor dropping) and
                # re-read the rest of it; the open snapshot grows to ``end`` (keeping its start, the
                # conservative rollback point) and stays open (docs/architecture.md)
                self.snap_end = end
                return
            self._violation(f"snapshot marker [{start},{end}] before the end of snapshot "
                            f"[{self.snap_start},{self.snap_end}]")
        if start > end:
            self._violation(f"snapshot marker with start {start} > end {end}")
        if end < self.seqno:
            self._violation(f"snapshot marker [{start},{end}] ends before the consumer's seqno {self.seqno}")
        self.pending = (start, end)
        self.state = PositionState.PENDING

    def item(self, seqno: int) -> None:
        """One item (mutation or deletion) with this seqno was processed."""
        state = self.state
        if state is PositionState.PENDING:
            start, end = self.pending  # type: ignore[misc]
            if not (start <= seqno <= end and seqno > self.seqno):
                self._violation(f"item seqno {seqno} outside snapshot [{start},{end}] or not after {self.seqno}")
            self.snap_start, self.snap_end = start, end
            self.pending = None
            self.state = PositionState.IN_SNAPSHOT
        elif state is PositionState.IN_SNAPSHOT:
            if not (self.seqno < seqno <= self.snap_end):
                self._violation(f"item seqno {seqno} not in ({self.seqno},{self.snap_end}]")
        else:
            self._violation(f"item seqno {seqno} outside any snapshot")
        self.seqno = seqno

    def items(self, first_seqno: int, last_seqno: int) -> None:
        """A whole batch of items was processed (fast path: only its first and last seqnos matter)."""
        self.item(first_seqno)
        if last_seqno != first_seqno:
            self.item(last_seqno)

    def snapshot_end(self) -> None:
        """The last item of the current snapshot was processed: the consumer now holds all of it."""
        if self.state is PositionState.PENDING:
            self.snap_start, self.snap_end = self.pending  # type: ignore[misc]
            self.pending = None
        elif self.state is not PositionState.IN_SNAPSHOT:
            self._violation("snapshot end outside any snapshot")
        self.seqno = self.snap_end
        self.last_complete = (self.snap_start, self.snap_end)
        self.state = PositionState.AT_BOUNDARY

    def stream_opened(self, failover_log: Sequence[FailoverEntry]) -> None:
        """The server accepted a stream request (status ok) and sent its failover log.

        Adopting the newest uuid is what DCP consumers do: an ok answer means our history up to
        ``seqno`` is a prefix of the newest branch."""
        if failover_log:
            self.failover_log = tuple(failover_log)
            self.uuid = self.failover_log[0].uuid
        self._resume()

    def connection_lost(self) -> None:
        """Frames after the last processed one are gone; a new stream request will follow."""
        self._resume()

    def rollback(self, seqno: int, failover_log: Sequence[FailoverEntry] = ()) -> None:
        """Apply a "roll back to ``seqno``" answer: drop history above it and pick the branch at it.

        The uuid becomes the newest failover entry at or below ``seqno`` (java-dcp-client
        ``rollbackToPosition``); with none, the consumer restarts from nothing (uuid 0, seqno 0)."""
        log = tuple(failover_log) or self.failover_log
        kept = tuple(e for e in log if e.seqno <= seqno)
        self.failover_log = kept
        if kept:
            self.uuid = kept[0].uuid
        else:
            self.uuid, seqno = 0, 0
        self.seqno = self.snap_start = self.snap_end = seqno
        self.last_complete = (seqno, seqno)
        self.pending = None
        self.state = PositionState.AT_BOUNDARY

    def reset(self) -> None:
        """Forget everything: the partition will be streamed again from seqno 0."""
        self.failover_log = ()
        self.rollback(0)

    def stream_ended(self, last_seqno: int | None) -> None:
        """A bounded stream ended: treat whatever was open as finished only if the server says so."""
        self.pending = None
        if self.state is PositionState.PENDING:
            self.state = PositionState.AT_BOUNDARY if self.seqno == self.snap_end else PositionState.RESUMED

    # ------------------------------------------------------------------ internals
    def _resume(self) -> None:
        self.pending = None
        if self.state is not PositionState.AT_BOUNDARY:
            self.state = PositionState.AT_BOUNDARY if self.seqno == self.snap_end else PositionState.RESUMED

    def _violation(self, message: str) -> None:
        raise ProtocolViolation(f"partition {self.partition}: {message}", partition=self.partition, seqno=self.seqno)
