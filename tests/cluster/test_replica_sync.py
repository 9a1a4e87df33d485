"""Catching up vs in sync (engine.cluster.replica_sync): a table of event sequences."""
from __future__ import annotations

import pytest

from engine.cluster.replica_sync import Progress, ReplicaSync


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], Progress(0, False)),  # a new copy catches up until a handshake says otherwise
        ([("requested", 0, 0)], Progress(0, True)),  # an empty active: nothing to catch up
        ([("requested", 50, 20)], Progress(20, False)),
        ([("requested", 50, 20), ("applied", 40)], Progress(40, False)),
        ([("requested", 50, 20), ("applied", 50)], Progress(50, True)),
        ([("requested", 50, 20), ("applied", 60)], Progress(60, True)),  # the goal does not move
        ([("requested", 50, 50), ("applied", 70)], Progress(70, True)),
        ([("requested", 50, 50), ("reset",)], Progress(0, False)),  # a resync starts over
        ([("requested", 50, 50), ("reset",), ("applied", 50)], Progress(50, True)),
        ([("requested", 50, 50), ("requested", 80, 50)], Progress(50, False)),  # behind at a new handshake
    ],
)
def test_progress(events, expected) -> None:
    sync = ReplicaSync()
    for event in events:
        if event[0] == "requested":
            sync.requested(event[1], event[2])
        elif event[0] == "applied":
            sync.snapshot_applied(event[1])
        else:
            sync.reset()
    assert sync.progress == expected


def test_changed_reports_each_progress_once_it_is_published() -> None:
    sync = ReplicaSync()
    first = sync.changed()
    assert first == Progress(0, False)
    assert sync.changed() == first  # not published yet: offered again
    sync.published(first)
    assert sync.changed() is None
    sync.requested(0, 0)
    assert sync.changed() == Progress(0, True)


@pytest.mark.parametrize(
    ("down_for", "active_live", "in_sync"),
    [
        (None, True, True),  # streaming
        (3.0, True, True),  # cut off, not for long yet
        (6.0, False, True),  # its active is dead: it stays promotable
        (6.0, True, False),  # cut off from a live active: it misses acknowledged writes
    ],
)
def test_a_copy_cut_off_from_a_live_active_falls_out_of_sync(down_for, active_live, in_sync) -> None:
    sync = ReplicaSync()
    sync.requested(10, 10)
    if down_for is not None:
        sync.stream_lost(100.0)
        sync.stream_lost(101.0)  # the first loss counts
    sync.tick(100.0 + (down_for or 0.0), active_live, max_down_s=5.0)
    assert sync.in_sync is in_sync
    sync.requested(10, 10)  # a new handshake: streaming again, caught up
    assert sync.in_sync and sync.down_since is None
