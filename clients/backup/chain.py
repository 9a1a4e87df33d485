"""How one partition's runs fit together, and which of their items are still history.

Theory of operation.  Run k of partition p covers the seqno range (start_k, end_k].  Normally
start_k == end_{k-1}: the runs tile the partition's history.  When the server demanded a rollback
in run k, start_k.seqno == R <= end_{k-1}.seqno: from R on the server's history branched away from
what earlier runs recorded, so every item an earlier run holds with seqno > R is abandoned history
and must never be restored.  Each earlier run therefore gets a *ceiling*: the smallest start seqno
of any later run in the chain, and only its items with seqno <= ceiling count.  This is how a
rollback is honoured without ever rewriting an earlier, already-committed run, and without mixing
two histories.

A merged run keeps the latest version of each key plus, for keys changed in its last source run,
the latest version at or below that run's start (``merge_floor``), so a later rollback into the
last source run's range still finds the right version.  A rollback that reaches below a merged
run's floor cannot be honoured exactly; ``links`` reports it as a ``ContinuityError`` instead of
restoring a state that never existed.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clients.backup.errors import ContinuityError
from clients.backup.manifest import PartitionRecord, RunManifest
from engine.protocol.client.offset import StreamOffset

NO_CEILING = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Link:
    """One run's contribution to a partition's restorable state."""

    run_id: str
    record: PartitionRecord
    ceiling: int  # items with seqno > ceiling are abandoned history

    @property
    def usable(self) -> bool:
        return self.ceiling > self.record.start.seqno and self.record.segment is not None


def links(runs: Sequence[RunManifest], partition: int) -> list[Link]:
    """The chain of ``partition`` across ``runs`` (oldest first), with each run's ceiling.
    """
    out: list[Link] = []
    ceiling = NO_CEILING
    for run in reversed(runs):
        rec = run.partitions.get(partition)
        if rec is None:
            raise ContinuityError(f"run {run.run_id} has no record for partition {partition}", partition=partition)
        floor = rec.merge_floor
        if rec.start.seqno < ceiling < floor:  # some of its items would count, but not exactly
            raise ContinuityError(
                f"partition {partition}: a later run rolled back to seqno {ceiling}, below what merged run "
                f"{run.run_id} kept exactly (seqno {floor}); restore an earlier run or take a full backup",
                partition=partition,
                seqno=ceiling,
            )
        out.append(Link(run.run_id, rec, ceiling))
        ceiling = min(ceiling, rec.start.seqno)
    out.reverse()
    return out


def continuity_problems(runs: Sequence[RunManifest], partition: int) -> list[ContinuityError]:
    """Every way ``partition``'s ranges fail to chain across ``runs`` (oldest first)."""
    problems: list[ContinuityError] = []
    prev: PartitionRecord | None = None
    prev_run = ""

    def bad(msg: str, seqno: int | None = None) -> None:
        problems.append(ContinuityError(f"partition {partition}: {msg}", partition=partition, seqno=seqno))

    for run in runs:
        rec = run.partitions.get(partition)
        if rec is None:
            bad(f"run {run.run_id} has no record")
            prev = None
            continue
        if rec.end.seqno < rec.start.seqno:
            bad(f"run {run.run_id} ends at seqno {rec.end.seqno} before its start {rec.start.seqno}", rec.end.seqno)
        if rec.first_seqno and rec.first_seqno <= rec.start.seqno:
            bad(f"run {run.run_id} holds seqno {rec.first_seqno}, not after its start {rec.start.seqno}", rec.first_seqno)
        if rec.failover_log and rec.end.uuid not in {u for u, _ in rec.failover_log}:
            bad(f"run {run.run_id} ends on branch uuid {rec.end.uuid}, which is not in the failover log it "
                f"recorded", rec.end.seqno)
        if rec.last_seqno > rec.end.seqno:
            bad(f"run {run.run_id} holds seqno {rec.last_seqno}, beyond its end {rec.end.seqno}", rec.last_seqno)
        if prev is None and run is runs[0]:
            if rec.start.seqno != 0:
                bad(f"first run {run.run_id} starts at seqno {rec.start.seqno}; the history before it is not archived",
                    rec.start.seqno)
        elif prev is not None:
            if rec.rollbacks:
                first = rec.rollbacks[0]
                if first.requested != prev.end:
                    bad(f"run {run.run_id} rolled back from {first.requested}, but run {prev_run} ended at {prev.end}",
                        first.requested.seqno)
                if rec.start.seqno != rec.rollbacks[-1].to_seqno:
                    bad(f"run {run.run_id} starts at seqno {rec.start.seqno}, not at its rollback point "
                        f"{rec.rollbacks[-1].to_seqno}", rec.start.seqno)
                if rec.start.seqno > prev.end.seqno:
                    bad(f"run {run.run_id} resumes at seqno {rec.start.seqno} after a rollback, beyond run "
                        f"{prev_run}'s end {prev.end.seqno}: seqnos in between are missing", prev.end.seqno)
            elif rec.start != prev.end:
                bad(f"run {run.run_id} starts at {_fmt(rec.start)} but run {prev_run} ended at {_fmt(prev.end)}",
                    rec.start.seqno)
        prev, prev_run = rec, run.run_id
    return problems


def _fmt(o: StreamOffset) -> str:
    return f"(uuid={o.uuid}, seqno={o.seqno}, snap={o.snap_start}..{o.snap_end})"
