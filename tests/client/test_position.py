"""The consumer position state machine, as transcripts: each row is a sequence of events and the
offset the consumer must send afterwards (dcp.md §1 'snapshot marker', JDCP-241, java-dcp-client#41)."""
import pytest

from clients.errors import ProtocolViolation
from engine.core.errors import InvalidInput
from engine.core.types import FailoverEntry
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.position import PartitionPosition, PositionState

LOG = (FailoverEntry(22, 10), FailoverEntry(11, 0))


def run(events, start=None):
    pos = PartitionPosition(3, start)
    for ev in events:
        name, *args = ev
        getattr(pos, name)(*args)
    return pos


CASES = [
    # (description, start offset, events, expected offset, expected state)
    ("fresh consumer", None, [], (0, 0, 0, 0), PositionState.AT_BOUNDARY),
    ("stream ok adopts the newest uuid", None, [("stream_opened", LOG)], (22, 0, 0, 0), PositionState.AT_BOUNDARY),
    ("marker alone is not promoted (JDCP-241)", None,
     [("stream_opened", LOG), ("snapshot_marker", 1, 5)], (22, 0, 0, 0), PositionState.PENDING),
    ("first item promotes the marker: partial snapshot", None,
     [("stream_opened", LOG), ("snapshot_marker", 1, 5), ("item", 2)], (22, 2, 1, 5), PositionState.IN_SNAPSHOT),
    ("snapshot end claims the snapshot end, even with deduplicated gaps", None,
     [("stream_opened", LOG), ("snapshot_marker", 1, 5), ("item", 2), ("item", 4), ("snapshot_end",)],
     (22, 5, 1, 5), PositionState.AT_BOUNDARY),
    ("batch fast path", None,
     [("snapshot_marker", 1, 9), ("items", 1, 7)], (0, 7, 1, 9), PositionState.IN_SNAPSHOT),
    ("connection lost mid-snapshot keeps the partial range", None,
     [("snapshot_marker", 1, 9), ("item", 3), ("connection_lost",)], (0, 3, 1, 9), PositionState.RESUMED),
    ("resumed stream opens a new snapshot", None,
     [("snapshot_marker", 1, 9), ("item", 3), ("connection_lost",), ("stream_opened", LOG),
      ("snapshot_marker", 3, 12), ("item", 8)], (22, 8, 3, 12), PositionState.IN_SNAPSHOT),
    ("connection lost with only a marker: back to the previous boundary", StreamOffset(22, 5, 1, 5),
     [("snapshot_marker", 6, 9), ("connection_lost",)], (22, 5, 1, 5), PositionState.AT_BOUNDARY),
    ("rollback picks the newest branch at or below R", StreamOffset(22, 15, 12, 20),
     [("rollback", 10, LOG)], (22, 10, 10, 10), PositionState.AT_BOUNDARY),
    ("rollback below the newest branch uses the older uuid", StreamOffset(22, 15, 12, 20),
     [("rollback", 9, LOG)], (11, 9, 9, 9), PositionState.AT_BOUNDARY),
    ("rollback with no entry at or below R restarts from nothing", StreamOffset(22, 15, 12, 20),
     [("rollback", 5, (FailoverEntry(22, 10),))], (0, 0, 0, 0), PositionState.AT_BOUNDARY),
    ("reset forgets everything", StreamOffset(22, 15, 15, 15), [("reset",)], (0, 0, 0, 0),
     PositionState.AT_BOUNDARY),
    ("saved partial offset resumes as RESUMED", StreamOffset(22, 7, 5, 9), [], (22, 7, 5, 9),
     PositionState.RESUMED),
    ("empty snapshot end completes the pending marker", StreamOffset(1, 5, 5, 5),
     [("snapshot_marker", 5, 8), ("snapshot_end",)], (1, 8, 5, 8), PositionState.AT_BOUNDARY),
]


@pytest.mark.parametrize("desc,start,events,expected,state", CASES, ids=[c[0] for c in CASES])
def test_transcripts(desc, start, events, expected, state):
    pos = run(events, start)
    assert pos.offset() == StreamOffset(*expected)
    assert pos.state is state


VIOLATIONS = [
    ("item outside any snapshot", [("item", 1)]),
    ("marker inside an open snapshot", [("snapshot_marker", 1, 5), ("item", 1), ("snapshot_marker", 6, 9)]),
    ("item beyond the snapshot end", [("snapshot_marker", 1, 5), ("item", 6)]),
    ("item not after the last one", [("snapshot_marker", 1, 5), ("item", 3), ("item", 3)]),
    ("end with no snapshot", [("snapshot_end",)]),
    ("marker with start > end", [("snapshot_marker", 5, 1)]),
]


@pytest.mark.parametrize("desc,events", VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_violations(desc, events):
    with pytest.raises(ProtocolViolation):
        run(events)


def test_item_at_or_below_resume_point_is_a_violation():
    with pytest.raises(ProtocolViolation):
        run([("snapshot_marker", 5, 9), ("item", 5)], StreamOffset(1, 5, 5, 5))


def test_last_complete_tracks_whole_snapshots_only():
    pos = run([("snapshot_marker", 1, 5), ("item", 5), ("snapshot_end",), ("snapshot_marker", 6, 9), ("item", 7)])
    assert pos.last_complete == (1, 5)


@pytest.mark.parametrize("args", [(0, 0, 1, 5), (0, 5, 6, 9), (0, 10, 1, 9), (-1, 0, 0, 0), (0, True, 0, 1)])
def test_offset_invariant(args):
    with pytest.raises(InvalidInput):
        StreamOffset(*args)


def test_offset_roundtrip_and_errors():
    off = StreamOffset(7, 5, 3, 9)
    assert StreamOffset.from_dict(off.to_dict()) == off
    assert not off.complete and StreamOffset.at(7, 5).complete
    with pytest.raises(InvalidInput, match="missing 'seqno'"):
        StreamOffset.from_dict({"uuid": 1, "snap_start": 0, "snap_end": 0})
    with pytest.raises(InvalidInput):
        StreamOffset.from_dict([1, 2])
