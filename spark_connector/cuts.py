"""Exact micro-batch ends: how a batch cut inside a snapshot is recorded and resumed.

A committed micro-batch must be an exact seqno range (a Kafka batch is): the end offset Spark
logs is what the batch delivered, and the next batch starts right after it.  The driver plans the
end seqno ``E`` of each partition before anything is read, but the server's snapshots are drawn
when the stream is served (a disk part up to the persisted seqno, a memory part up to the high
seqno of that moment), so the snapshot containing ``E`` may go on past it.  ``read()`` therefore
drops every item above ``E`` (``items_through``), and the end position is recorded as what it
is, a *partial* snapshot in the protocol's sense:

* ``snap_start`` is the seqno the batch's last stream request for the partition starts from, plus
  one: every snapshot a stream request from ``s`` receives starts above ``s`` (the server opens a
  new snapshot for each request), so this is at or below the true start of the snapshot that holds
  ``E``, never above it.  A batch that crosses the persisted seqno is read as two requests split
  there (``pivot``), so that point is the persisted seqno and a crash rolls back no further;
* the true ``snap_end`` is unknown when the offset is logged, only bounded: it is at least ``E``
  and at most the high seqno of the branch the batch read.  The offset says so with
  ``open_snapshot`` and stores ``E``; ``resume_position`` puts the bound back in when the position
  is checked or sent: the partition's high seqno while the position's branch is still the newest
  one (a branch only grows), and beyond any seqno once a newer branch exists, so the server's
  rollback rule (``engine.core.rollback.decide``: a partial snapshot crossing the branch point
  rolls back to ``snap_start - 1``) treats it exactly as a partial snapshot that crossed it.

Resuming from such a position follows the protocol's rule for a mid-snapshot position: the next
stream request opens a new snapshot after ``E``, whose items are every key's latest version above
``E``, so no key the cut left out is lost and none already delivered comes again.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from engine.core.types import MAX_SEQNO
from engine.protocol.client.offset import StreamOffset

from .offsets import PartitionOffset


def pivot(start_seqno: int, end_seqno: int, persisted_seqno: int) -> int:
    """Where the batch ``start_seqno -> end_seqno`` opens its last stream request: at the
    partition's persisted seqno when that lies inside the range, else at the start.

    The server sends the persisted history as one disk snapshot; cutting the request there makes
    the last request's snapshots start above the persisted seqno, so after a crash (whose new
    branch begins at the persisted seqno) the end position rolls back to that branch point, not to
    the batch's start."""
    return persisted_seqno if start_seqno < persisted_seqno < end_seqno else start_seqno


def end_position(start: PartitionOffset, end_seqno: int, uuid: int, persisted_seqno: int = 0) -> PartitionOffset:
    """The end offset of a batch that advanced a partition from ``start`` to ``end_seqno``; its last
    stream request begins at ``pivot`` (the offset records it as ``snap_start - 1``)."""
    if end_seqno <= start.seqno:
        return start
    return replace(start, uuid=uuid, seqno=end_seqno, snap_start=pivot(start.seqno, end_seqno, persisted_seqno) + 1,
                   snap_end=end_seqno, open_snapshot=True)


def resume_position(pos: PartitionOffset, newest_uuid: int, high_seqno: int) -> StreamOffset:
    """The stream position to check or request for ``pos`` against a partition whose newest
    branch is ``newest_uuid`` with ``high_seqno`` (see the module docstring)."""
    if not pos.open_snapshot:
        return StreamOffset(pos.uuid, pos.seqno, pos.snap_start, pos.snap_end)
    snap_end = max(pos.seqno, high_seqno) if pos.uuid == newest_uuid else MAX_SEQNO
    return StreamOffset(pos.uuid, pos.seqno, pos.snap_start, snap_end)


def items_through(seqnos: Sequence[int], end: int) -> int:
    """How many leading items of a seqno-ordered batch are at or below ``end`` (the rest belong to
    the next micro-batch)."""
    lo, hi = 0, len(seqnos)
    while lo < hi:
        mid = (lo + hi) // 2
        if seqnos[mid] <= end:
            lo = mid + 1
        else:
            hi = mid
    return lo
