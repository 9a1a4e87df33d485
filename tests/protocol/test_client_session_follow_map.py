"""``ClientSession(follow_map=True)``: a cluster consumer's per-node session hands a partition that
is not active on its node to the router (``Moved``) instead of reconnecting, and gives its
checkpoint up (``release``) so that the next node's session resumes exactly there."""
from __future__ import annotations

import pytest

from engine.core.types import FailoverEntry as FE
from engine.protocol import messages as M
from engine.protocol.client.actions import EndAction, Moved, Reconnect, StreamEnded
from engine.protocol.client.checkpoint import ConsumerState, PartitionCheckpoint
from engine.protocol.client.errors import UsageError
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.session import MAX_NOT_MY_PARTITION, ClientSession
from tests.protocol.test_client_session_receive import LOGS, batch, end, marker, ok, req

NMP_DETAIL = "partition 1 is replica on this node (map revision 9; served by n2)"

# (description, follow_map, messages before, last message, expected actions)
CASES = [
    ("not my partition moves, naming the map revision", True, [],
     M.StreamResponse(1, M.StreamStatus.NOT_MY_PARTITION, detail=NMP_DETAIL),
     [Moved(1, "not_my_partition", 9, NMP_DETAIL)]),
    ("not my partition without a revision moves", True, [], M.StreamResponse(1, M.StreamStatus.NOT_MY_PARTITION),
     [Moved(1, "not_my_partition", None, None)]),
    ("state changed ends the stream and moves", True, [ok(0)], end(0, "state_changed"),
     [StreamEnded(0, "state_changed", None, None, EndAction.RECONNECT), Moved(0, "state_changed")]),
    ("shutting down still reconnects (the connection is going)", True, [ok(0)], end(0, "shutting_down"),
     [StreamEnded(0, "shutting_down", None, None, EndAction.RECONNECT),
      Reconnect("partition 0 stream ended: shutting_down")]),
    ("without follow_map state changed reconnects as before", False, [ok(0)], end(0, "state_changed"),
     [StreamEnded(0, "state_changed", None, None, EndAction.RECONNECT),
      Reconnect("partition 0 stream ended: state_changed")]),
]


def started(follow_map: bool, **kw) -> ClientSession:
    session = ClientSession(start="beginning", follow_map=follow_map, **kw)
    session.receive_handshake(LOGS, 100)
    return session


@pytest.mark.parametrize("desc,follow,before,msg,expected", CASES, ids=[c[0] for c in CASES])
def test_receive_following_the_map(desc, follow, before, msg, expected):
    session = started(follow)
    for m in before:
        session.receive(m)
    assert session.receive(msg) == expected


def test_not_my_partition_is_never_given_up_when_following_the_map():
    session = started(True)
    for _ in range(MAX_NOT_MY_PARTITION * 2):
        assert type(session.receive(M.StreamResponse(1, M.StreamStatus.NOT_MY_PARTITION))[0]) is Moved


def test_release_hands_over_the_processed_checkpoint_and_the_next_session_resumes_there():
    session = started(True)
    session.receive(ok(0))
    session.receive(marker(0, 1, 3))
    session.receive(batch(0, 1, 2))
    session.positions[0].items(1, 2)  # processed up to 2 of the snapshot 1..3
    session.receive(end(0, "state_changed"))
    cp = session.release(0)
    assert cp == PartitionCheckpoint(StreamOffset(7, 2, 1, 3), (FE(7, 40), FE(3, 0)), (0, 0))
    assert 0 not in session.positions and 0 not in session.state().partitions
    assert session.hello("c").partitions is None or 0 not in session.hello("c").partitions
    # the next node: a session started from the checkpoint requests exactly that position
    other = ClientSession(partitions=[0], start="saved", saved=ConsumerState({0: cp}), follow_map=True)
    logs = M.FailoverLogs("node-b", 2, {0: M.PartitionInfo("active", 60, 0, (FE(8, 50), FE(7, 40), FE(3, 0)))})
    assert [a.message for a in other.receive_handshake(logs, 10)] == [req(0, uuid=7, seqno=2, ss=1, se=3)]


def test_release_of_an_open_stream_is_refused():
    session = started(True)
    session.receive(ok(0))
    with pytest.raises(UsageError):
        session.release(0)


def test_released_partition_leaves_a_named_hello_and_the_saved_state():
    saved = ConsumerState({0: PartitionCheckpoint(StreamOffset.at(7, 4)), 1: PartitionCheckpoint(StreamOffset.at(5, 1))})
    session = ClientSession(partitions=[0, 1], start="saved", saved=saved, follow_map=True)
    session.receive_handshake(LOGS, 1)
    session.receive(M.StreamResponse(1, M.StreamStatus.NOT_MY_PARTITION))
    session.release(1)
    assert session.hello("c").partitions == (0,)
    assert set(session.state().partitions) == {0}
