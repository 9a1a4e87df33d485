"""Which snapshots a replica partition holds whole, in memory and on disk.

A replica receives its active's history as snapshots (a marker ``(start, end)``, then the items of
that range, deduplicated).  Only at a snapshot's end does the copy equal a state the active
really had; in the middle it is a mix no one ever saw (dcp.md §1).  So a replica needs two
answers, and this value gives both for any seqno it may be asked about:

* the **resume range**: the position ``(seqno, snap_start, snap_end)`` to stream on from, so the
  active can finish a partial snapshot or tell it to roll back;
* the **last complete snapshot end**: the seqno a failover promotion starts the new branch at
  (``failover_policy.Promoted``).

Why per seqno and not one pair of fields: the flusher persists up to an arbitrary seqno, often
in the middle of a snapshot, and what survives a crash is exactly the range at that seqno.  The
flusher stores ``at(persisted seqno)`` with the persisted seqno in one transaction, then
``persisted(upto)`` forgets the markers wholly below it, so the list stays as short as the
unpersisted part of the queue.

An immutable value: the applier replaces it under the engine's writer lock, the flusher reads
it with one attribute read.  Pure standard library; table-tested in
tests/engine/test_replica_snapshots.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.errors import InvalidInput

__all__ = ["SnapshotMark", "ReplicaSnapshots"]


@dataclass(frozen=True, slots=True)
class SnapshotMark:
    """Where a copy stands at one seqno: the snapshot range around it and the last whole one."""

    snap_start: int
    snap_end: int
    complete_end: int


@dataclass(frozen=True, slots=True)
class ReplicaSnapshots:
    """``base`` holds at ``base_seqno`` (what is persisted); ``marks`` are the snapshot markers
    received above it, ascending."""

    base: SnapshotMark = SnapshotMark(0, 0, 0)
    base_seqno: int = 0
    marks: tuple[tuple[int, int], ...] = ()

    @classmethod
    def restored(cls, mark: SnapshotMark, persisted_seqno: int) -> "ReplicaSnapshots":
        """The value after an open: the persisted mark, at the persisted seqno."""
        return cls(mark, persisted_seqno, ())

    def marker(self, start: int, end: int, high_seqno: int) -> "ReplicaSnapshots":
        """A snapshot marker arrived while the copy holds up to ``high_seqno``.

        It must cover seqnos above what the copy holds (``end > high_seqno``) and begin no later
        than its own end.  When the previous snapshot is not yet whole (a stream resumed in the
        middle of it), the new marker continues it: the copy holds a part of the old range and
        will hold the rest of the new one, so it is whole only at the new end, and a crash in
        between must resume from the old start."""
        if not 0 <= start <= end:
            raise InvalidInput(f"snapshot marker ({start}, {end}) is not a range", field="snapshot")
        if end <= high_seqno:
            raise InvalidInput(f"snapshot marker ({start}, {end}) ends at or below the seqno "
                               f"{high_seqno} this copy already holds", field="snapshot", seqno=end)
        marks = self.marks
        if marks and marks[-1][1] > high_seqno:
            start = min(start, marks[-1][0])
            marks = marks[:-1]
        elif not marks and self.base.snap_end > high_seqno:  # restored in the middle of a snapshot
            start = min(start, self.base.snap_start)
        return ReplicaSnapshots(self.base, self.base_seqno, (*marks, (start, end)))

    @property
    def current(self) -> tuple[int, int] | None:
        """The newest snapshot marker received, or None."""
        return self.marks[-1] if self.marks else None

    def at(self, seqno: int) -> SnapshotMark:
        """Where a copy holding every item up to ``seqno`` (and nothing above) stands."""
        cur = self.base
        if seqno < self.base_seqno:
            raise InvalidInput(f"seqno {seqno} is below the persisted seqno {self.base_seqno}", seqno=seqno)
        for start, end in self.marks:
            if end <= seqno:
                cur = SnapshotMark(start, end, end)
            elif start <= seqno:
                return SnapshotMark(start, end, cur.complete_end)
            else:
                break
        if cur.snap_end < seqno:
            # past a whole snapshot and before the next marker: the active had nothing in between
            # (or the copy's own history, when an active was demoted), so this is a whole state too
            return SnapshotMark(seqno, seqno, seqno)
        return cur

    def persisted(self, seqno: int) -> "ReplicaSnapshots":
        """Everything up to ``seqno`` is on disk (with ``at(seqno)``): drop the markers below it."""
        if seqno <= self.base_seqno:
            return self
        mark = self.at(seqno)
        return ReplicaSnapshots(mark, seqno, tuple(m for m in self.marks if m[1] > seqno))
