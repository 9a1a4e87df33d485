"""A replica's rollback decision (engine.cluster.replica_rollback): tables, no engine."""
from __future__ import annotations

import pytest

from engine.cluster.replica_rollback import Resync, Undo, Version, plan_undo, resume_uuid
from engine.core.types import FailoverEntry as E


def v(seqno: int, rev: int, deleted: bool = False) -> Version:
    return Version(seqno, 1000 + seqno, rev, deleted)


S = 10


@pytest.mark.parametrize(
    ("first_above", "below", "searched_all", "expected"),
    [
        ({}, {}, True, {}),  # nothing above S: only the log is cut
        ({b"a": v(12, 3)}, {b"a": v(7, 2)}, False, {b"a": v(7, 2)}),  # the next rev: exact
        ({b"a": v(12, 3)}, {b"a": v(7, 2, True)}, False, {b"a": v(7, 2, True)}),  # a tombstone at S
        ({b"n": v(11, 1)}, {}, True, {b"n": None}),  # created above S: no record at S
        ({b"a": v(12, 3), b"n": v(11, 1)}, {b"a": v(7, 2)}, True, {b"a": v(7, 2), b"n": None}),
        ({b"a": v(12, 4)}, {b"a": v(7, 2)}, False, "missing"),  # rev 3 is gone (compacted, deduplicated)
        ({b"a": v(12, 3)}, {}, True, "no longer"),  # the version at S is gone altogether
        ({b"n": v(11, 1)}, {b"n": v(3, 5, True)}, True, "purged"),  # rev 1 after a version: a purge
        ({b"n": v(11, 1)}, {}, False, "unproven"),  # the search stopped: absence is not proven
    ],
)
def test_plan(first_above, below, searched_all, expected) -> None:
    plan = plan_undo(S, first_above, below, items_above=len(first_above), searched_all=searched_all)
    if isinstance(expected, str):
        assert isinstance(plan, Resync) and expected in plan.reason and plan.seqno == S
    else:
        assert plan == Undo(S, expected, len(first_above))


def test_limits() -> None:
    assert "undo limit" in plan_undo(S, {}, {}, items_above=11, searched_all=True, max_items=10).reason
    assert isinstance(plan_undo(S, {}, {}, items_above=10, searched_all=True, max_items=10), Undo)
    assert isinstance(plan_undo(0, {}, {}, items_above=0, searched_all=True), Resync)  # nothing to keep


@pytest.mark.parametrize(
    ("log", "high", "expected"),
    [
        ((), 5, 0),
        ((E(2, 0),), 0, 2),
        ((E(2, 0),), 5, 2),
        ((E(3, 5), E(2, 0)), 5, 2),  # an unclean restart's branch at the persisted seqno holds nothing yet
        ((E(3, 5), E(2, 0)), 6, 3),
        ((E(3, 9), E(2, 0)), 5, 2),  # the active's log adopted while behind: the branch of seqno 5
        ((E(3, 5),), 5, 3),  # no older entry: the newest
    ],
)
def test_resume_uuid(log, high, expected) -> None:
    assert resume_uuid(log, high) == expected


def test_a_copy_rolled_back_by_undo_catches_up_from_the_rollback_seqno() -> None:
    from engine.cluster.replica_sync import Progress, ReplicaSync

    sync = ReplicaSync(30)
    sync.requested(25, 30)  # ahead of an active whose branch holds 25: "in sync" by the figures
    sync.rolled_back(20)
    assert sync.progress == Progress(20, False)  # holds 20 whole, and catches up to 25
    sync.snapshot_applied(25)
    assert sync.progress == Progress(25, True)
    sync.requested(20, 30)
    sync.rolled_back(20)  # nothing written on the new branch yet: it holds all of it
    assert sync.progress == Progress(20, True)
