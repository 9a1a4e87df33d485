"""Planning a micro-batch: which seqnos each partition streams, and how they are grouped into tasks.

Pure functions over offsets, so the driver's two Spark callbacks (``latestOffset`` decides the end
offset, ``partitions`` turns a (start, end) pair into tasks) stay deterministic: a batch replayed
after a crash is planned from the two logged offsets alone and gets the same work.
"""
from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from engine.protocol.client.offset import StreamOffset

from .cuts import resume_position
from .offsets import PartitionOffset, SourceOffset, stream_start

#: Tasks per batch when ``minPartitions`` is not given: enough to keep the default ``local[*]``
#: session's cores busy, few enough that per-task fixed costs (a Python worker's Arrow hand-off to
#: the JVM, a WebSocket hello) stay small: on the 2-core machine 4 tasks keep more of the raw
#: client rate than 8 (see docs/benchmarks.md, Spark).  On a cluster, set ``minPartitions`` to the
#: executors' cores.
DEFAULT_TASKS = 4

#: Below this many seqnos of backlog per task a batch gets fewer tasks (at least one): every task
#: costs fixed work (a Python worker hand-off for the read and for each Python stage after it, a
#: WebSocket hello, an output file), which is most of a small incremental batch (see
#: docs/benchmarks.md, Spark: the per-run cost notes).
ROWS_PER_TASK = 25_000


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One bounded stream request: partition ``partition`` from position ``start`` (exclusive) to
    ``end`` (inclusive), on branch ``uuid`` with the snapshot range of the start position.  The
    read keeps no item past ``end``: a batch is an exact range (``spark_connector.cuts``).

    ``control`` is ``"reset"`` or ``"rollback"`` when the batch must first tell the consumer that
    the partition was reset (restreamed from 0) or rolled back to ``start``; only the first piece
    of a split partition carries it.
    """

    partition: int
    uuid: int
    start: int
    snap_start: int
    snap_end: int
    end: int
    control: str | None = None
    branch_uuid: int | None = None   # uuid of the end position's branch (pieces that start mid-range use it)
    open_snapshot: bool = False      # the start position is a batch cut inside a snapshot (``cuts``)

    @property
    def backlog(self) -> int:
        return max(0, self.end - self.start)

    @property
    def position(self) -> StreamOffset:
        """Where the stream of this piece resumes, for a start that is not an open snapshot."""
        return StreamOffset(self.uuid, self.start, self.snap_start, self.snap_end)

    def resume_position(self, newest_uuid: int, high_seqno: int) -> StreamOffset:
        """The stream request's position, with an open snapshot's end bounded as ``cuts`` says."""
        start = PartitionOffset(self.uuid, self.start, self.snap_start, self.snap_end,
                                open_snapshot=self.open_snapshot)
        return resume_position(start, newest_uuid, high_seqno)


def work_items(start: SourceOffset, end: SourceOffset) -> list[WorkItem]:
    """The stream requests of the batch ``start -> end`` (no items for partitions with nothing new,
    unless a control row must be delivered)."""
    if start.latest_sentinel or end.latest_sentinel:
        return []   # batch 0 after startingOffsets=latest: sentinel -> concrete, always empty
    items = []
    for pid in sorted(end.partitions):
        pos, control = stream_start(start, end, pid)
        e = end.partitions[pid]
        if e.seqno > pos.seqno or control is not None:
            first = WorkItem(pid, pos.uuid, pos.seqno, pos.snap_start, pos.snap_end,
                             max(e.seqno, pos.seqno), control, e.uuid, open_snapshot=pos.open_snapshot)
            at = e.snap_start - 1 if e.open_snapshot else pos.seqno
            if pos.seqno < at < e.seqno:
                # the end names where its last request starts (spark_connector.cuts.pivot)
                items += [replace(first, end=at), WorkItem(pid, e.uuid, at, at, at, e.seqno, None, e.uuid)]
            else:
                items.append(first)
    return items


def split_items(items: Sequence[WorkItem], min_tasks: int) -> list[WorkItem]:
    """Split the largest backlogs into seqno sub-ranges until there are at least ``min_tasks``
    pieces (the Kafka source's ``minPartitions`` rule).

    A piece starting mid-partition is a resume from a complete point (snapshot = its start), which
    is sound for a bounded by-seqno stream: every key's latest version lies in exactly one piece.
    """
    pieces = list(items)
    total = sum(i.backlog for i in pieces)
    if min_tasks <= len(pieces) or total == 0:
        return pieces
    out: list[WorkItem] = []
    for item in pieces:
        n = max(1, round(min_tasks * item.backlog / total))
        n = min(n, item.backlog) if item.backlog else 1
        step = -(-item.backlog // n) if n else item.backlog
        lo = item.start
        first = True
        while True:
            hi = min(item.end, lo + step) if step else item.end
            if first:
                out.append(replace(item, end=hi))
            else:   # a resume from a complete point on the branch the batch ends on
                uuid = item.branch_uuid if item.branch_uuid is not None else item.uuid
                out.append(WorkItem(item.partition, uuid, lo, lo, lo, hi, None, item.branch_uuid))
            first = False
            lo = hi
            if lo >= item.end:
                break
    return out


def pack(items: Sequence[WorkItem], tasks: int) -> list[list[WorkItem]]:
    """Group work items into at most ``tasks`` groups of similar backlog (longest first onto the
    least loaded group), each group's items in partition order; empty groups are dropped."""
    if not items:
        return []
    tasks = max(1, min(tasks, len(items)))
    heap = [(0, i) for i in range(tasks)]
    groups: list[list[WorkItem]] = [[] for _ in range(tasks)]
    for item in sorted(items, key=lambda w: (-w.backlog, w.partition, w.start)):
        load, idx = heapq.heappop(heap)
        groups[idx].append(item)
        heapq.heappush(heap, (load + max(1, item.backlog), idx))
    return [sorted(g, key=lambda w: (w.partition, w.start)) for g in groups if g]


def plan_tasks(start: SourceOffset, end: SourceOffset, min_partitions: int | None) -> list[list[WorkItem]]:
    """Tasks of the batch ``start -> end``: ``minPartitions`` when given (large backlogs split),
    else up to ``DEFAULT_TASKS`` with at least ~``ROWS_PER_TASK`` seqnos of backlog each, so a
    small batch is one or a few tasks."""
    items = work_items(start, end)
    if min_partitions:
        return pack(split_items(items, min_partitions), max(min_partitions, 1))
    backlog = sum(i.backlog for i in items)
    return pack(items, max(1, min(DEFAULT_TASKS, -(-backlog // ROWS_PER_TASK))))


def apply_budget(backlogs: Mapping[int, int], max_rows: int | None) -> dict[int, int]:
    """How many seqnos each partition may advance in this batch under a ``max_rows`` budget.

    Like the Kafka source: the budget is split in proportion to the backlogs (rounded down, the
    remainder handed out to the largest backlogs), every partition with a backlog advancing by at
    least one so none starves.  Without a budget every partition takes its whole backlog.
    """
    active = {p: b for p, b in backlogs.items() if b > 0}
    total = sum(active.values())
    if max_rows is None or total <= max_rows:
        return dict(backlogs)
    out = {p: 0 for p in backlogs}
    given = 0
    for p, b in active.items():
        share = min(b, max(1, b * max_rows // total))
        out[p] = share
        given += share
    for p in sorted(active, key=lambda p: (-active[p], p)):
        if given >= max_rows:
            break
        extra = min(active[p] - out[p], max_rows - given)
        out[p] += extra
        given += extra
    return out
