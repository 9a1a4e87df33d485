"""Which snapshots a replica holds whole (engine.core.replica_snapshots): tables, no engine."""
from __future__ import annotations

import pytest

from engine.core.errors import InvalidInput
from engine.core.replica_snapshots import ReplicaSnapshots, SnapshotMark as M

# markers received (start, end, high seqno when it arrived), then: seqno -> where the copy stands
TWO = [(1, 10, 0), (11, 20, 10)]


@pytest.mark.parametrize(
    ("markers", "seqno", "expected"),
    [
        ([], 0, M(0, 0, 0)),
        ([(1, 10, 0)], 0, M(0, 0, 0)),  # nothing of the snapshot yet: the empty whole state
        ([(1, 10, 0)], 4, M(1, 10, 0)),  # partial: resume inside (1, 10), nothing whole yet
        ([(1, 10, 0)], 10, M(1, 10, 10)),  # whole
        (TWO, 15, M(11, 20, 10)),
        (TWO, 20, M(11, 20, 20)),
        ([(1, 10, 0), (15, 20, 10)], 12, M(12, 12, 12)),  # between snapshots: nothing existed there
        ([(1, 10, 0), (5, 30, 4)], 20, M(1, 30, 0)),  # resumed mid-snapshot: continues the old range
    ],
)
def test_where_the_copy_stands(markers, seqno, expected) -> None:
    s = ReplicaSnapshots()
    for start, end, high in markers:
        s = s.marker(start, end, high)
    assert s.at(seqno) == expected


def test_persisted_forgets_whole_markers_and_keeps_the_answer() -> None:
    s = ReplicaSnapshots()
    for start, end, high in TWO:
        s = s.marker(start, end, high)
    p = s.persisted(15)
    assert p.marks == ((11, 20),) and p.base == M(11, 20, 10) and p.base_seqno == 15
    for seqno in (15, 18, 20):
        assert p.at(seqno) == s.at(seqno)
    assert p.persisted(20).marks == () and p.persisted(20).at(20) == M(11, 20, 20)
    assert p.persisted(10) is p  # never backwards


def test_restored_mid_snapshot_resumes_the_old_range() -> None:
    r = ReplicaSnapshots.restored(M(11, 20, 10), 15)
    assert r.at(15) == M(11, 20, 10)
    r = r.marker(16, 25, 15)  # the active finishes the snapshot it was sending, and more
    assert r.at(18) == M(11, 25, 10) and r.at(25) == M(11, 25, 25)


@pytest.mark.parametrize(("start", "end", "high"), [(5, 4, 0), (1, 10, 10), (1, 5, 8), (-1, 3, 0)])
def test_bad_markers_are_refused(start, end, high) -> None:
    with pytest.raises(InvalidInput):
        ReplicaSnapshots().marker(start, end, high)


def test_a_seqno_below_what_is_persisted_is_refused() -> None:
    with pytest.raises(InvalidInput):
        ReplicaSnapshots.restored(M(5, 5, 5), 5).at(4)
