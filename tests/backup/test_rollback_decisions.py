"""``rollbacks.decide``: where a partition restarts after the server demands a rollback.

Each row reads as a sentence: "the run started at S and holds exact states at <boundaries>; the
archive holds exact states at <archived>; the server says roll back to R -> restart from B, on the
client's own stream (continue) or on a new one (handoff)".
"""
from __future__ import annotations

import pytest

from clients.backup.rollbacks import RollbackDecision, decide

ROWS = [
    # point, start, run boundaries, archived, reset, reconnected -> in_run, boundary, handoff
    # history branched since the last run, at a run end: the client's narrow resume is exact
    (100, 150, [150], [0, 100, 150], False, False, RollbackDecision(False, 100, False)),
    # ... at a seqno inside an archived deduplicated snapshot: back to the run end below it
    (120, 150, [150], [0, 100, 150], False, False, RollbackDecision(False, 100, True)),
    # ... below every archived boundary but 0: full retake of the partition
    (40, 150, [150], [0, 100, 150], False, False, RollbackDecision(False, 0, True)),
    # the client wants to reset the partition: we still restart narrowly, on our own stream
    (100, 150, [150], [0, 100, 150], True, False, RollbackDecision(False, 100, True)),
    # the client reconnected (server restart): its frozen end may lie beyond the new branch
    (100, 150, [150], [0, 100, 150], False, True, RollbackDecision(False, 100, True)),
    # server restarted mid-run, point at the end of a snapshot this run completed: cut back there
    (180, 150, [150, 170, 180, 200], [0, 150], False, True, RollbackDecision(True, 180, True)),
    # ... point inside a snapshot this run took: cut back to that snapshot's start boundary
    (190, 150, [150, 170, 180, 200], [0, 150], False, True, RollbackDecision(True, 180, True)),
    # ... point before any completed snapshot: everything this run took goes
    (160, 150, [150], [0, 150], False, True, RollbackDecision(True, 150, True)),
    # a point exactly at the run start is "in run": nothing of this run survives, nothing earlier is touched
    (150, 150, [150, 170], [0, 150], False, True, RollbackDecision(True, 150, True)),
    # first run (start 0): any rollback is in-run
    (30, 0, [0, 25, 60], [], False, True, RollbackDecision(True, 25, True)),
]


@pytest.mark.parametrize(("point", "start", "run_b", "archived", "reset", "reconnected", "want"), ROWS)
def test_decide(point: int, start: int, run_b: list[int], archived: list[int], reset: bool, reconnected: bool,
                want: RollbackDecision) -> None:
    got = decide(point=point, start=start, run_boundaries=run_b, archived_boundaries=archived, reset=reset,
                 reconnected=reconnected)
    assert got == want


def test_a_narrow_resume_only_ever_lands_on_an_exact_boundary() -> None:
    import itertools

    archived = [0, 10, 35, 70]
    run_b = [70, 80, 95]
    for point, reset, rec in itertools.product(range(0, 120), (False, True), (False, True)):
        d = decide(point=point, start=70, run_boundaries=run_b, archived_boundaries=archived, reset=reset,
                   reconnected=rec)
        assert d.boundary <= point
        assert d.boundary in (run_b if d.in_run else archived)
        if not d.handoff:
            assert d.boundary == point and not reset and not rec
