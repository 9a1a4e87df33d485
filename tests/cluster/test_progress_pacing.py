"""``PublishPacer``: which replica progress reaches etcd on which tick (pure, table-driven)."""
from __future__ import annotations

import pytest

from app.cluster.progress_pacing import PublishPacer
from engine.cluster.replica_sync import Progress

S, C = True, False  # in sync, catching up
LOST = "lost"  # the copy's stream is down on that tick

# one copy, a tick every 0.2 s, max age 1 s, settle 0.6 s: (seqno, in_sync[, LOST]) per tick ->
# the ticks that publish
CASES = [
    ("the first report goes out at once", [(5, C)], [0]),
    ("nothing new, nothing sent", [(5, C), (5, C), (5, C)], [0]),
    ("in sync flips at once, both ways", [(5, C), (9, S), (12, C)], [0, 1, 2]),
    ("a moving seqno at most once a second",
     [(1, S), (2, S), (3, S), (4, S), (5, S), (6, S), (7, S), (8, S), (9, S), (10, S), (11, S), (12, S)], [0, 5, 10]),
    ("one quiet tick among moving ones is not settled", [(1, S), (2, S), (2, S), (3, S), (3, S), (4, S)], [0, 5]),
    ("a seqno that stopped is sent once it stayed 0.6 s", [(1, S), (2, S), (3, S), (3, S), (3, S), (3, S), (3, S)], [0, 5]),
    ("a lost stream sends the last figure on the next tick", [(1, S), (2, S), (3, S, LOST)], [0, 2]),
    ("stopping right after a publish sends nothing more", [(1, S), (2, S), (2, S), (2, S), (2, S), (2, S)], [0, 4]),
]


@pytest.mark.parametrize("name,ticks,sent", CASES, ids=[c[0] for c in CASES])
def test_which_ticks_publish(name: str, ticks: list[tuple], sent: list[int]) -> None:
    pacer = PublishPacer(max_age_s=1.0, settle_s=0.6)
    got = []
    for i, (seqno, in_sync, *lost) in enumerate(ticks):
        now = round(i * 0.2, 6) + 1e-9 * i  # a hair past each 0.2 s step: no float ties
        progress = Progress(seqno, in_sync)
        if pacer.due(7, now, progress, stream_lost=bool(lost)):
            pacer.published(7, now, progress)
            got.append(i)
    assert got == sent


def test_a_copy_gone_and_back_publishes_its_first_report_at_once() -> None:
    pacer = PublishPacer(max_age_s=1.0, settle_s=0.6)
    assert pacer.due(3, 0.0, Progress(4, True))
    pacer.published(3, 0.0, Progress(4, True))
    pacer.forget(3)
    assert pacer.due(3, 0.1, Progress(4, True))


def test_copies_are_paced_apart() -> None:
    pacer = PublishPacer(max_age_s=1.0, settle_s=0.6)
    for p in (1, 2):
        assert pacer.due(p, 0.0, Progress(1, True))
        pacer.published(p, 0.0, Progress(1, True))
    assert not pacer.due(1, 0.2, Progress(2, True))  # still moving
    assert pacer.due(2, 0.2, Progress(1, False))  # fell out of sync


def test_moving_copies_half_their_age_ride_along_with_a_publishing_tick() -> None:
    pacer = PublishPacer(max_age_s=1.0, settle_s=0.6)
    pacer.published(1, 0.0, Progress(1, True))
    pacer.published(2, 0.4, Progress(1, True))
    pacer.published(3, 0.8, Progress(1, True))
    for p in (1, 2, 3):
        pacer.due(p, 0.9, Progress(2, True))  # all three moving
    assert pacer.due(1, 1.0, Progress(3, True))  # its age: due on its own
    assert pacer.due(2, 1.0, Progress(3, True), riding=True)  # 0.6 s old: rides along
    assert not pacer.due(3, 1.0, Progress(3, True), riding=True)  # 0.2 s old: waits
    assert not pacer.due(2, 1.0, Progress(3, True))  # without a publishing tick it waits too
