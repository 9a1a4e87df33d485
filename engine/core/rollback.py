"""The producer's rollback decision, DCP's ``FailoverTable::needsRollback`` as a pure function.

Theory of operation
-------------------
A consumer resumes a partition with the position it saved: the uuid of the history branch it
last saw, the last seqno it *has* (``start_seqno``) and the snapshot it was receiving
(``snap_start``..``snap_end``).  The server owns the failover log (newest first): each entry
``(uuid, seqno)`` says "from ``seqno`` on, history is branch ``uuid``".  The consumer's branch is
shared with ours up to ``upper``: the seqno at which the *next newer* branch began, or our high
seqno when the consumer's branch is our newest one.

The rules, in the order DCP applies them (``../shared/notes/dcp.md`` §1a), each one named by the
``RollbackReason`` (or ``OkRule``) it produces:

1. ``start == 0`` (and the uuid check is not strict, or the uuid is 0): the consumer has nothing
   to lose, so no rollback (``OkRule.FROM_ZERO``).
2. ``0 < start < purge_seqno``: tombstones below the purge seqno are gone, so the consumer
   could miss deletions: roll back to 0 (``PURGED``).
3. The consumer's uuid is not in the log: no common history, roll back to 0 (``UNKNOWN_UUID``).
4. If ``start == snap_start`` the consumer has none of that snapshot: treat ``snap_end`` as
   ``start``.
5. ``snap_end <= upper``: everything the consumer has (or was about to have) is on our branch:
   no rollback (``OkRule.SAME_HISTORY``).
6. If ``start == snap_end`` the consumer has the whole snapshot: treat ``snap_start`` as
   ``start``.
7. Roll back to ``upper`` if ``upper < snap_start`` (``DIVERGED``: the consumer went past the
   branch point), else to ``snap_start - 1`` (``PARTIAL_SNAPSHOT``: a deduplicated snapshot is
   only consistent once complete, so a partly received one cannot be trusted past the branch
   point).

   Rule 7 deliberately differs from DCP by one: DCP rolls back to ``snap_start`` itself.  Here
   a snapshot marker starts at the first seqno it covers, so the consumer's last consistent
   state is ``snap_start - 1``, the end of its last whole snapshot.  At ``snap_start`` it may
   lack the item of that seqno: deduplication drops it from the snapshot when the same key
   changes again later in it (write ``c`` at 1, persist, write ``a``, ``b``, ``c`` again, receive
   ``a`` and ``b``, crash back to 1: rolled back to 1 the consumer would never get ``c``).
   Rolling back one seqno further costs at most the items of one snapshot.

The consumer then undoes everything above the rollback seqno and re-requests with
``start = snap_start = snap_end = rollback_seqno``; the server re-runs the check, which may roll
it back further.

Request validation follows DCP's ERANGE checks and raises ``SeqnoRangeError`` naming the field:
``snap_start <= start_seqno <= snap_end`` is checked before the rules (a position that breaks it
is not a position at all); ``start_seqno > end_seqno`` and ``start_seqno > high_seqno`` are checked
after them, because a consumer that is merely *ahead* of a branch point must be told to roll back,
not refused (DCP's log line for these reads "should have rolled back instead").  With a
well-formed failover log the last check cannot fire after the rules passed; it stays as a guard
for corrupt positions.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.errors import SeqnoRangeError
from engine.core.types import MAX_SEQNO, FailoverEntry

__all__ = [
    "MustRollBack",
    "OkRule",
    "RollbackReason",
    "StreamOk",
    "StreamPosition",
    "check_range",
    "decide",
    "validate_position",
]


class RollbackReason(enum.StrEnum):
    """Why a consumer must roll back; the value travels in ``stream_response.reason``."""

    UNKNOWN_UUID = "unknown_uuid"
    PURGED = "purged"
    DIVERGED = "diverged"
    PARTIAL_SNAPSHOT = "partial_snapshot"


class OkRule(enum.StrEnum):
    """Which rule let a request through (useful to explain a position check)."""

    FROM_ZERO = "from_zero"
    SAME_HISTORY = "same_history"


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """What a consumer holds for one partition, as sent in a stream request.

    ``end_seqno`` None means an endless stream.  ``strict_uuid`` is DCP's StrictVBUUID flag:
    check the uuid even when ``start_seqno`` is 0.
    """

    uuid: int
    start_seqno: int
    snap_start: int
    snap_end: int
    end_seqno: int | None = None
    strict_uuid: bool = False


@dataclass(frozen=True, slots=True)
class StreamOk:
    """Stream from ``start_seqno`` (exclusive): the consumer's history is ours up to there."""

    start_seqno: int
    rule: OkRule
    detail: str


@dataclass(frozen=True, slots=True)
class MustRollBack:
    """The consumer must discard everything above ``seqno`` and re-request from it."""

    seqno: int
    reason: RollbackReason
    detail: str


def validate_position(position: StreamPosition) -> None:
    """DCP's first ERANGE check: ``snap_start <= start_seqno <= snap_end`` and seqnos in u64."""
    for name in ("start_seqno", "snap_start", "snap_end"):
        value = getattr(position, name)
        if not 0 <= value <= MAX_SEQNO:
            raise SeqnoRangeError(f"{name} {value} is outside 0..2^64-1", field=name, seqno=value)
    if position.end_seqno is not None and not 0 <= position.end_seqno <= MAX_SEQNO:
        raise SeqnoRangeError(
            f"end_seqno {position.end_seqno} is outside 0..2^64-1", field="end_seqno", seqno=position.end_seqno
        )
    if position.snap_start > position.start_seqno:
        raise SeqnoRangeError(
            f"snap_start {position.snap_start} > start_seqno {position.start_seqno}: "
            "a position must satisfy snap_start <= start_seqno <= snap_end",
            field="snap_start",
            seqno=position.snap_start,
        )
    if position.start_seqno > position.snap_end:
        raise SeqnoRangeError(
            f"start_seqno {position.start_seqno} > snap_end {position.snap_end}: "
            "a position must satisfy snap_start <= start_seqno <= snap_end",
            field="snap_end",
            seqno=position.snap_end,
        )


def check_range(position: StreamPosition, high_seqno: int) -> None:
    """DCP's ERANGE checks that follow the rollback rules: start <= end, start <= high seqno."""
    if position.end_seqno is not None and position.start_seqno > position.end_seqno:
        raise SeqnoRangeError(
            f"start_seqno {position.start_seqno} > end_seqno {position.end_seqno}",
            field="end_seqno",
            seqno=position.end_seqno,
        )
    if position.start_seqno > high_seqno:
        raise SeqnoRangeError(
            f"start_seqno {position.start_seqno} > the partition's high seqno {high_seqno}",
            field="start_seqno",
            seqno=position.start_seqno,
        )


def decide(
    failover_log: Sequence[FailoverEntry],
    high_seqno: int,
    purge_seqno: int,
    request: StreamPosition,
) -> StreamOk | MustRollBack:
    """Answer a stream request: ``StreamOk`` or ``MustRollBack`` (see the module docstring).

    ``failover_log`` is newest first.  Raises ``SeqnoRangeError`` for an invalid position.
    """
    validate_position(request)
    verdict = _needs_rollback(failover_log, high_seqno, purge_seqno, request)
    if isinstance(verdict, StreamOk):
        check_range(request, high_seqno)
    return verdict


def _needs_rollback(
    log: Sequence[FailoverEntry], high_seqno: int, purge_seqno: int, req: StreamPosition
) -> StreamOk | MustRollBack:
    start = req.start_seqno
    # Rule 1: nothing received, nothing to undo.
    if start == 0 and (not req.strict_uuid or req.uuid == 0):
        return StreamOk(0, OkRule.FROM_ZERO, "start_seqno is 0: the consumer has nothing to roll back")
    # Rule 2: tombstones the consumer never saw may have been purged.
    if start != 0 and start < purge_seqno:
        return MustRollBack(
            0,
            RollbackReason.PURGED,
            f"start_seqno {start} < purge seqno {purge_seqno}: deletions up to {purge_seqno} "
            "were purged and could be missed; roll back to 0",
        )
    # Rule 3: find the consumer's branch, scanning oldest -> newest as DCP does.
    upper: int | None = None
    where = ""
    for index in range(len(log) - 1, -1, -1):
        if log[index].uuid == req.uuid:
            if index > 0:
                upper = log[index - 1].seqno
                where = f"seqno {upper}, where the branch after uuid {req.uuid} began"
            else:
                upper = high_seqno
                where = f"the high seqno {upper} of uuid {req.uuid}, the newest branch"
            break
    if upper is None:
        return MustRollBack(
            0,
            RollbackReason.UNKNOWN_UUID,
            f"uuid {req.uuid} is not in the failover log: no common history; roll back to 0",
        )
    snap_start, snap_end = req.snap_start, req.snap_end
    # Rule 4: the consumer has none of that snapshot.
    if start == snap_start:
        snap_end = start
    # Rule 5: everything the consumer has is on our branch.
    if snap_end <= upper:
        return StreamOk(
            start,
            OkRule.SAME_HISTORY,
            f"snapshot end {snap_end} <= {where}: same history",
        )
    # Rule 6: the consumer has the whole snapshot.
    if start == snap_end:
        snap_start = start
    # Rule 7.
    if upper < snap_start:
        return MustRollBack(
            upper,
            RollbackReason.DIVERGED,
            f"consumer is ahead of the branch point: it has seqnos up to {start} but shares "
            f"history only up to {where}; roll back to {upper}",
        )
    before = max(snap_start - 1, 0)
    return MustRollBack(
        before,
        RollbackReason.PARTIAL_SNAPSHOT,
        f"consumer is mid-snapshot {req.snap_start}..{req.snap_end} (has up to {start}) and the "
        f"snapshot crosses {where}; a partial snapshot cannot be trusted, roll back to {before}, "
        "the end of the last whole snapshot before it",
    )

