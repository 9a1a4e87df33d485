"""The rollback decision, rule by rule (../shared/notes/dcp.md §1a, kv_engine needsRollback).

Each row names the rule it exercises; a reader checks the table against the DCP rules line by
line.  Failover logs are written newest first, as the server stores them.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.errors import SeqnoRangeError
from engine.core.rollback import (
    MustRollBack,
    OkRule,
    RollbackReason,
    StreamOk,
    StreamPosition,
    check_range,
    decide,
)
from engine.core.types import FailoverEntry

A, B, C = 0xA, 0xB, 0xC


def log(*entries: tuple[int, int]) -> tuple[FailoverEntry, ...]:
    return tuple(FailoverEntry(uuid, seqno) for uuid, seqno in entries)


@dataclass(frozen=True)
class Case:
    rule: str
    log: tuple[FailoverEntry, ...]
    high: int
    purge: int
    uuid: int
    start: int
    snap: tuple[int, int]
    expect: tuple[str, int]  # ("ok", start) or (reason, rollback seqno)
    strict: bool = False

    def position(self) -> StreamPosition:
        return StreamPosition(self.uuid, self.start, self.snap[0], self.snap[1], strict_uuid=self.strict)


ONE = log((A, 0))
TWO = log((B, 80), (A, 0))  # branch A until 80, then B (e.g. an unclean restart at persisted seqno 80)
THREE = log((C, 150), (B, 80), (A, 0))

CASES = [
    # Rule 1: start 0 never rolls back unless the uuid check is strict.
    Case("start 0 streams from zero even with an unknown uuid", ONE, 100, 0, 0xDEAD, 0, (0, 0), ("ok", 0)),
    Case("start 0 streams from zero whatever the purge seqno", ONE, 100, 50, A, 0, (0, 0), ("ok", 0)),
    Case("strict uuid with uuid 0 at start 0 streams from zero", ONE, 100, 0, 0, 0, (0, 0), ("ok", 0), True),
    Case("strict uuid checks an unknown uuid even at start 0", ONE, 100, 0, 0xDEAD, 0, (0, 0),
         ("unknown_uuid", 0), True),
    Case("strict uuid with a known uuid at start 0 is ok", TWO, 100, 0, A, 0, (0, 0), ("ok", 0), True),
    # Rule 2: starting below the purge seqno could miss purged deletions.
    Case("start below the purge seqno rolls back to 0", ONE, 100, 50, A, 49, (49, 49), ("purged", 0)),
    Case("purge check comes before the uuid check", ONE, 100, 50, 0xDEAD, 10, (10, 10), ("purged", 0)),
    Case("start equal to the purge seqno is not purged", ONE, 100, 50, A, 50, (50, 50), ("ok", 50)),
    # Rule 3: a uuid not in the log means no common history.
    Case("unknown uuid rolls back to 0", TWO, 100, 0, 0xDEAD, 10, (10, 10), ("unknown_uuid", 0)),
    Case("empty failover log knows no uuid", (), 100, 0, A, 10, (10, 10), ("unknown_uuid", 0)),
    # Rule 5 with upper = high seqno: the consumer's branch is our newest.
    Case("newest branch, whole snapshot below high seqno is ok", ONE, 100, 0, A, 60, (40, 60), ("ok", 60)),
    Case("newest branch, mid-snapshot below high seqno is ok", ONE, 100, 0, A, 50, (40, 60), ("ok", 50)),
    Case("newest branch, at the high seqno is ok", ONE, 100, 0, A, 100, (90, 100), ("ok", 100)),
    # Rule 5 with upper = next newer entry's seqno.
    Case("older branch, whole snapshot below the branch point is ok", TWO, 120, 0, A, 70, (60, 70), ("ok", 70)),
    Case("older branch, exactly at the branch point is ok", TWO, 120, 0, A, 80, (80, 80), ("ok", 80)),
    Case("older branch, mid-snapshot ending at the branch point is ok", TWO, 120, 0, A, 75, (70, 80),
         ("ok", 75)),
    # Rule 4: start == snap_start means the consumer has none of that snapshot.
    Case("none of a snapshot that crosses the branch point: only start counts", TWO, 120, 0, A, 70, (70, 95),
         ("ok", 70)),
    Case("none of a snapshot starting past the branch point: diverged at the branch point", TWO, 120, 0, A, 85,
         (85, 95), ("diverged", 80)),
    # Rule 6/7: whole snapshot past the branch point -> roll back to the branch point.
    Case("whole snapshot past the branch point rolls back to the branch point", TWO, 120, 0, A, 100, (90, 100),
         ("diverged", 80)),
    Case("whole snapshot that straddles the branch point rolls back to the branch point", TWO, 120, 0, A, 100,
         (70, 100), ("diverged", 80)),
    # Rule 7: partial snapshot that crosses the branch point -> the seqno before its start.
    Case("partial snapshot crossing the branch point rolls back to the end of the snapshot before it", TWO, 120, 0, A, 78,
         (75, 90), ("partial_snapshot", 74)),
    Case("partial snapshot wholly past the branch point rolls back to the branch point", TWO, 120, 0, A, 95,
         (90, 100), ("diverged", 80)),
    Case("partial snapshot starting at the branch point rolls back to just before it", TWO, 120, 0, A, 85, (80, 90),
         ("partial_snapshot", 79)),
    # Consumer ahead of the newest branch's high seqno (memory-only items lost without a new entry).
    Case("newest branch, consumer ahead of the high seqno rolls back to it", ONE, 80, 0, A, 100, (100, 100),
         ("diverged", 80)),
    Case("newest branch, partial snapshot past the high seqno rolls back to just before it", ONE, 80, 0, A, 75,
         (70, 90), ("partial_snapshot", 69)),
    # Unclean restart: the consumer streamed 81..100 from memory, the server restarted at 80.
    Case("unclean restart: resumed consumer rolls back to the persisted seqno", TWO, 80, 0, A, 100, (81, 100),
         ("diverged", 80)),
    # Multi-entry logs: upper is the *next newer* entry, not the high seqno.
    Case("three branches, oldest branch ahead of its branch point", THREE, 200, 0, A, 100, (100, 100),
         ("diverged", 80)),
    Case("three branches, middle branch below its branch point is ok", THREE, 200, 0, B, 120, (100, 120),
         ("ok", 120)),
    Case("three branches, middle branch past its branch point", THREE, 200, 0, B, 160, (155, 160),
         ("diverged", 150)),
    Case("three branches, middle branch partial across its branch point", THREE, 200, 0, B, 149, (140, 160),
         ("partial_snapshot", 139)),
    Case("three branches, newest branch is bounded by the high seqno", THREE, 200, 0, C, 190, (180, 190),
         ("ok", 190)),
    Case("three branches, purge still wins over a known uuid", THREE, 200, 100, C, 90, (90, 90), ("purged", 0)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_rollback_rule(case: Case) -> None:
    verdict = decide(case.log, case.high, case.purge, case.position())
    kind, seqno = case.expect
    if kind == "ok":
        assert isinstance(verdict, StreamOk), verdict
        assert verdict.start_seqno == seqno
    else:
        assert isinstance(verdict, MustRollBack), verdict
        assert (verdict.reason.value, verdict.seqno) == (kind, seqno)


def test_ok_names_its_rule() -> None:
    assert decide(ONE, 10, 0, StreamPosition(A, 0, 0, 0)).rule is OkRule.FROM_ZERO
    assert decide(ONE, 10, 0, StreamPosition(A, 5, 5, 5)).rule is OkRule.SAME_HISTORY


@pytest.mark.parametrize(
    ("case", "words"),
    [
        (StreamPosition(A, 10, 10, 10), ["purge seqno 50", "start_seqno 10"]),
        (StreamPosition(0xDEAD, 60, 60, 60), ["uuid 57005", "not in the failover log"]),
    ],
)
def test_rollback_detail_names_rule_and_numbers(case: StreamPosition, words: list[str]) -> None:
    verdict = decide(ONE, 100, 50, case)
    assert isinstance(verdict, MustRollBack)
    for word in words:
        assert word in verdict.detail


def test_diverged_detail_names_the_branch_point() -> None:
    verdict = decide(TWO, 120, 0, StreamPosition(A, 100, 90, 100))
    assert isinstance(verdict, MustRollBack)
    assert verdict.reason is RollbackReason.DIVERGED
    assert "seqno 80" in verdict.detail and "branch" in verdict.detail and "100" in verdict.detail


def test_partial_snapshot_detail_names_the_snapshot() -> None:
    verdict = decide(TWO, 120, 0, StreamPosition(A, 78, 75, 90))
    assert isinstance(verdict, MustRollBack)
    assert "75..90" in verdict.detail and "78" in verdict.detail


# ------------------------------------------------------------------ ERANGE validation


@pytest.mark.parametrize(
    ("rule", "position", "high", "field"),
    [
        ("snap_start above start is refused", StreamPosition(A, 10, 11, 20), 100, "snap_start"),
        ("start above snap_end is refused", StreamPosition(A, 21, 10, 20), 100, "snap_end"),
        ("negative start is refused", StreamPosition(A, -1, 0, 0), 100, "start_seqno"),
        ("start above 2^64-1 is refused", StreamPosition(A, 1 << 64, 1 << 64, 1 << 64), 100, "start_seqno"),
        ("negative end is refused", StreamPosition(A, 0, 0, 0, end_seqno=-5), 100, "end_seqno"),
        ("start above an explicit end is refused", StreamPosition(A, 50, 50, 50, end_seqno=40), 100, "end_seqno"),
    ],
)
def test_invalid_position_raises_range_error_naming_the_field(
    rule: str, position: StreamPosition, high: int, field: str
) -> None:
    with pytest.raises(SeqnoRangeError) as info:
        decide(ONE, high, 0, position)
    assert info.value.field == field
    assert info.value.code == "seqno_range"


def test_snapshot_invariant_is_checked_before_the_rules() -> None:
    # Even a start-0 request (rule 1 would say ok) must be a valid position.
    with pytest.raises(SeqnoRangeError):
        decide(ONE, 100, 0, StreamPosition(A, 0, 5, 10))


def test_a_consumer_that_must_roll_back_is_told_so_rather_than_refused() -> None:
    # start > end would be ERANGE, but the consumer is ahead of the branch point: DCP rolls back first.
    verdict = decide(TWO, 120, 0, StreamPosition(A, 100, 100, 100, end_seqno=90))
    assert isinstance(verdict, MustRollBack) and verdict.seqno == 80


def test_start_above_high_seqno_is_a_range_error_naming_start_seqno() -> None:
    with pytest.raises(SeqnoRangeError) as info:
        check_range(StreamPosition(A, 101, 101, 101), 100)
    assert info.value.field == "start_seqno"
    assert "high seqno 100" in info.value.message


def test_start_equal_to_end_is_a_valid_empty_stream() -> None:
    verdict = decide(ONE, 100, 0, StreamPosition(A, 50, 50, 50, end_seqno=50))
    assert isinstance(verdict, StreamOk)


# ------------------------------------------------------------------ property: rollback converges


@st.composite
def histories(draw: st.DrawFn) -> tuple[tuple[FailoverEntry, ...], int, int]:
    seqnos = sorted(draw(st.lists(st.integers(1, 500), max_size=5, unique=True)), reverse=True)
    high = draw(st.integers(seqnos[0] if seqnos else 0, 600))
    entries = [FailoverEntry(uuid=i + 1, seqno=s) for i, s in enumerate(seqnos)] + [
        FailoverEntry(uuid=len(seqnos) + 1, seqno=0)
    ]
    purge = draw(st.integers(0, high))
    return tuple(entries), high, purge


@given(histories(), st.integers(0, 8), st.integers(0, 700), st.integers(0, 50), st.integers(0, 50))
def test_following_rollbacks_always_reaches_a_position_the_server_accepts(
    history: tuple[tuple[FailoverEntry, ...], int, int], uuid: int, start: int, below: int, above: int
) -> None:
    failover_log, high, purge = history
    position = StreamPosition(uuid, start, max(0, start - below), start + above)
    for _ in range(len(failover_log) + 3):
        verdict = decide(failover_log, high, purge, position)
        if isinstance(verdict, StreamOk):
            assert verdict.start_seqno <= high
            return
        assert verdict.seqno <= min(position.start_seqno, high)
        # The consumer rolls back and picks the newest entry at or below the rollback seqno (DCP clients do).
        known = [e for e in failover_log if e.seqno <= verdict.seqno]
        new_uuid = known[0].uuid if known and verdict.seqno else 0
        position = StreamPosition(new_uuid, verdict.seqno, verdict.seqno, verdict.seqno)
    pytest.fail(f"no convergence from {position}")
