"""When a failover entry is added (engine.core.failover_policy): one table for every event."""
from __future__ import annotations

import pytest

from engine.core import failover_policy as policy
from engine.core.failover_policy import Opened, Promoted, StateChanged, TakenOver
from engine.core.types import FailoverEntry as E
from engine.core.types import PartitionState as S

LOG = (E(7, 40), E(3, 0))


@pytest.mark.parametrize(
    ("log", "event", "branch_at"),
    [
        # opening the store
        ((), Opened(created=True, clean=False, persisted_seqno=0), 0),
        (LOG, Opened(created=False, clean=True, persisted_seqno=90), None),  # history continues
        (LOG, Opened(created=False, clean=False, persisted_seqno=90), 90),  # memory-only items gone
        (LOG, Opened(created=False, clean=False, persisted_seqno=40), 40),
        ((), Opened(created=False, clean=True, persisted_seqno=90), 90),  # every entry erased on load
        ((), Opened(created=False, clean=False, persisted_seqno=0), 0),
        # a replica's history is its active's: it streams what it lost again, never branches
        (LOG, Opened(created=False, clean=False, persisted_seqno=90, replica=True), None),
        ((), Opened(created=False, clean=False, persisted_seqno=0, replica=True), None),
        ((), Opened(created=True, clean=False, persisted_seqno=0, replica=True), 0),
        # cluster activations: failover branches at the last whole snapshot, takeover continues
        (LOG, Promoted(last_complete_seqno=100), 100),
        (LOG, Promoted(last_complete_seqno=30), 30),  # the entry at 40 is dropped: diverged
        (LOG, TakenOver(), None),
        # state changes: only a promotion starts a branch, at the high seqno
        (LOG, StateChanged(S.REPLICA, S.ACTIVE, high_seqno=120), 120),
        (LOG, StateChanged(S.PENDING, S.ACTIVE, high_seqno=120), 120),
        (LOG, StateChanged(S.DEAD, S.ACTIVE, high_seqno=0), 0),
        (LOG, StateChanged(S.ACTIVE, S.REPLICA, high_seqno=120), None),
        (LOG, StateChanged(S.ACTIVE, S.DEAD, high_seqno=120), None),
        (LOG, StateChanged(S.REPLICA, S.PENDING, high_seqno=120), None),
        (LOG, StateChanged(S.ACTIVE, S.ACTIVE, high_seqno=120), None),
    ],
)
def test_new_branch_at(log, event, branch_at) -> None:
    assert policy.new_branch_at(log, event) == branch_at
    after = policy.apply(log, event, cap=25)
    if branch_at is None:
        assert after is log
    else:
        newest, *rest = after
        assert newest.seqno == branch_at and newest.uuid not in {0, *(e.uuid for e in log)}
        assert tuple(rest) == tuple(e for e in log if e.seqno <= branch_at)


def test_apply_keeps_the_cap_and_prunes_diverged_entries() -> None:
    log = (E(9, 100), E(8, 60), E(7, 40), E(3, 0))
    after = policy.apply(log, Opened(created=False, clean=False, persisted_seqno=50), cap=3)
    assert after[0].seqno == 50 and after[1:] == (E(7, 40), E(3, 0))
    after = policy.apply(log, StateChanged(S.REPLICA, S.ACTIVE, high_seqno=200), cap=2)
    assert after[0].seqno == 200 and after[1:] == (E(9, 100),)
