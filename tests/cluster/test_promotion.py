"""Promotion rules, one test per rule (engine.cluster.promotion's docstring lists them)."""
import pytest

from engine.cluster.partition_map import Placement
from engine.cluster.promotion import Promote, ReplicaProgress, Unavailable, choose_successor

PLACEMENT = Placement("dead", ("r1", "r2", "r3"))
ALL_LIVE = {"r1", "r2", "r3"}


def _choose(progress: dict[str, tuple[int, bool]], live: set[str] = ALL_LIVE, force: bool = False):
    return choose_successor(
        5, PLACEMENT, {n: ReplicaProgress(s, i) for n, (s, i) in progress.items()}, live, force=force
    )


def test_only_an_in_sync_replica_may_stand() -> None:
    assert _choose({"r1": (900, False), "r2": (800, True)}) == Promote(5, "r2", 800)


def test_the_in_sync_replica_with_the_highest_complete_snapshot_wins() -> None:
    assert _choose({"r1": (700, True), "r2": (950, True), "r3": (900, True)}) == Promote(5, "r2", 950)


def test_ties_go_to_the_replica_listed_first() -> None:
    assert _choose({"r3": (900, True), "r2": (900, True)}) == Promote(5, "r2", 900)


def test_a_dead_replica_never_stands() -> None:
    assert _choose({"r1": (999, True), "r2": (10, True)}, live={"r2"}) == Promote(5, "r2", 10)


def test_force_takes_the_live_replica_with_the_highest_seqno_and_says_so() -> None:
    assert _choose({"r1": (900, False), "r2": (800, False)}, force=True) == Promote(5, "r1", 900, forced=True)
    assert _choose({"r1": (900, True)}, force=True) == Promote(5, "r1", 900, forced=False)


@pytest.mark.parametrize(
    ("placement", "progress", "live", "reason"),
    [
        (Placement("dead"), {}, ALL_LIVE, "no replica"),
        (PLACEMENT, {"r1": (1, True)}, set(), "no replica is alive"),
        (PLACEMENT, {}, ALL_LIVE, "reported its progress"),
        (PLACEMENT, {"r1": (40, False)}, ALL_LIVE, "r1 catching up at seqno 40"),
    ],
)
def test_when_nobody_may_stand_the_reason_says_why(
    placement: Placement, progress: dict[str, tuple[int, bool]], live: set[str], reason: str
) -> None:
    answer = choose_successor(5, placement, {n: ReplicaProgress(*v) for n, v in progress.items()}, live)
    assert isinstance(answer, Unavailable) and answer.partition == 5
    assert reason in answer.reason
