"""What the backup does when the server says "roll back partition p to R" (pure, table-tested).

Theory of operation.  The archive may only resume a partition at a seqno where it holds an
*exact* state: the start of a run, the end of a complete snapshot, a merged run's floor.  Inside a
deduplicated snapshot older versions of keys that changed again later in the same snapshot are
missing, so cutting there would restore a state that never existed.  Hence:

    R inside this run's range (R >= start; only after a reconnect: the server restarted mid-run)
        cut this run's segment back to B = the newest exact boundary <= R;
        the client may continue at R only if B == R and it is not resetting the partition;
        otherwise the partition is streamed again from B ("handoff": ``Consumer.seek``).
    R below this run's start (the history branched since an earlier run)
        the new start is B = the newest archived exact boundary <= R (0 if none); earlier runs'
        items above B are masked by the chain's ceilings, never rewritten;
        continue at R when B == R on a fresh, non-resetting client, else hand off from B.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RollbackDecision:
    in_run: bool
    #: the exact boundary the partition restarts from (in-run: what the segment is cut back to)
    boundary: int
    #: True: stream the partition from ``boundary`` on a new stream; False: the client's own resume at R is exact
    handoff: bool


def decide(*, point: int, start: int, run_boundaries: Iterable[int], archived_boundaries: Iterable[int],
           reset: bool = False, reconnected: bool = False) -> RollbackDecision:
    """``reset``: the client wants to restream the partition from 0 (its "repair" policy without
    ring coverage); ``reconnected``: the client's "until now" ends were taken before a server
    restart, on a branch that may end below them.  The driver needs neither any more (it uses the
    "report" policy, and the client lowers "until now" ends on a new branch); both force a handoff
    for callers that still do."""
    if point >= start:
        boundary = max((b for b in run_boundaries if b <= point), default=start)
        return RollbackDecision(True, boundary, boundary != point or reset or reconnected)
    boundary = max((b for b in archived_boundaries if b <= point), default=0)
    return RollbackDecision(False, boundary, boundary != point or reset or reconnected)
