"""Whether flushing to disk works, and what to do while it does not.

Theory of operation.  The flusher thread reports each round's outcome here as an event:
``failed(...)`` with the kind of failure and what is waiting to be persisted, or
``succeeded(...)`` with what the round wrote.  ``FlushHealth`` answers with decisions:

* how long to wait before the next attempt (``retry_delay``): capped exponential backoff,
  so a full disk costs a handful of attempts per second, not one every few milliseconds;
* whether a log line is due: only when the state changes (healthy -> failing, one kind of
  failure -> another, failing -> recovered), never once per retry;
* ``fault``: the current fault, read by readiness, metrics, the write path (backpressure once
  the unpersisted backlog passes its bound) and persist waiters (answered at once with
  ``InsufficientStorage`` instead of waiting for a round that will fail).

The flusher keeps every queued item until a commit succeeds, so recovery needs no decision:
the next successful round persists what the failed ones could not.

Pure standard library and no clock of its own (callers pass ``now``), so the rules are tested
with tables and no disk.
"""
from __future__ import annotations

import errno as errnos
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

#: Free space below which an I/O error on a commit is taken for a full disk.  WHY: LMDB reports
#: a short ``pwrite`` (the disk filled up part-way through a commit) as EIO, not ENOSPC; after
#: such a write the file holds every block the disk had left, so the free space is about zero.
LOW_SPACE_BYTES = 16 << 20
FIRST_RETRY_S = 0.05


class FaultKind(str, Enum):
    NO_SPACE = "no_space"
    WRITE_ERROR = "write_error"


def classify(error_number: int | None, free_bytes: int | None) -> FaultKind:
    """The kind of a failed flush, from the error's errno (None if it had none) and the free
    space left on the data dir's filesystem (None if unknown)."""
    if error_number in (errnos.ENOSPC, errnos.EDQUOT):
        return FaultKind.NO_SPACE
    if error_number == errnos.EIO and free_bytes is not None and free_bytes < LOW_SPACE_BYTES:
        return FaultKind.NO_SPACE
    return FaultKind.WRITE_ERROR


def describe_ranges(pending: Mapping[int, tuple[int, int]], limit: int = 8) -> str:
    """``partition 0 seqnos 11..40, partition 3 seqnos 5..9`` (the first ``limit`` partitions)."""
    if not pending:
        return "no partition"
    shown = sorted(pending.items())
    text = ", ".join(f"partition {p} seqnos {lo}..{hi}" for p, (lo, hi) in shown[:limit])
    if len(shown) > limit:
        text += f" and {len(shown) - limit} more partition(s)"
    return text


@dataclass(frozen=True, slots=True)
class FlushFault:
    """The flusher is failing: since when (monotonic seconds), why, and what waits for disk.

    ``pending`` maps each partition with unpersisted writes to its unpersisted seqno range
    (first, last) as of the first failed round of this fault."""

    kind: FaultKind
    reason: str
    since: float
    pending: Mapping[int, tuple[int, int]]

    def describe(self) -> str:
        what = "the disk holding the data dir is full" if self.kind is FaultKind.NO_SPACE else "the flush fails"
        return f"{what} ({self.reason})"


@dataclass(frozen=True, slots=True)
class FlushFailing:
    """State change: flushing started failing (or failed in another way than before)."""

    fault: FlushFault
    max_retry_s: float

    def message(self) -> str:
        f = self.fault
        return (f"flushing to disk is failing: {f.describe()}; unpersisted writes stay queued in memory "
                f"({describe_ranges(f.pending)}); retrying with backoff up to {self.max_retry_s:g} s")


@dataclass(frozen=True, slots=True)
class FlushRecovered:
    """State change: a round succeeded after a fault."""

    fault: FlushFault
    failed_for_s: float
    failed_rounds: int
    items: int
    nbytes: int
    still_queued: int

    def message(self) -> str:
        return (f"flushing to disk recovered after {self.failed_for_s:.1f} s and {self.failed_rounds} failed "
                f"round(s) ({self.fault.kind.value}): this round persisted {self.items} item(s), "
                f"{self.nbytes} bytes; {self.still_queued} item(s) still queued"
                + (", flushing now" if self.still_queued else ""))


class FlushHealth:
    """The flusher's fault state (one instance per flusher; only the flusher thread calls the
    event methods, any thread may read ``fault``: one attribute read)."""

    def __init__(self, max_retry_s: float, first_retry_s: float = FIRST_RETRY_S) -> None:
        self.first_retry_s = max(first_retry_s, 0.0)
        self.max_retry_s = max(max_retry_s, self.first_retry_s)
        self.fault: FlushFault | None = None
        self.consecutive_failures = 0
        self.failed_rounds_total = 0

    def failed(self, now: float, kind: FaultKind, reason: str,
               pending: Mapping[int, tuple[int, int]]) -> FlushFailing | None:
        """A round failed; returns the state change to log, or None while the fault goes on."""
        self.consecutive_failures += 1
        self.failed_rounds_total += 1
        current = self.fault
        if current is not None and current.kind is kind:
            return None
        since = current.since if current is not None else now
        self.fault = FlushFault(kind, reason, since, dict(pending))
        return FlushFailing(self.fault, self.max_retry_s)

    def succeeded(self, now: float, items: int, nbytes: int, still_queued: int) -> FlushRecovered | None:
        """A round committed; returns the recovery to log, or None if nothing was failing."""
        fault, failures = self.fault, self.consecutive_failures
        self.consecutive_failures = 0
        if fault is None:
            return None
        self.fault = None
        return FlushRecovered(fault, max(now - fault.since, 0.0), failures, items, nbytes, still_queued)

    def retry_delay(self) -> float:
        """Seconds to wait before the next attempt after ``consecutive_failures`` failed rounds:
        ``first_retry_s`` doubled per further failure, never above ``max_retry_s``."""
        if self.consecutive_failures <= 0:
            return 0.0
        exponent = min(self.consecutive_failures - 1, 62)
        return min(self.first_retry_s * (1 << exponent), self.max_retry_s)
