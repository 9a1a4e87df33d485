"""ClientSession rules the caller controls, as tables: "until now" ends after a history branch."""
import pytest

from clients.session import ClientSession
from engine.protocol.messages import PartitionInfo, StreamRequest
from engine.types import FailoverEntry as FE

LOG0 = (FE(7, 40), FE(3, 0))
INFOS = {0: PartitionInfo("active", 50, 0, LOG0), 1: PartitionInfo("active", 9, 0, (FE(5, 0),))}


def req(p, uuid, seqno, ss, se, end=None):
    return StreamRequest(p, uuid, seqno, ss, se, end_seqno=end)


def reconnect(s, high, log=LOG0, p=0):
    s.connection_lost()
    infos = dict(INFOS)
    infos[p] = PartitionInfo("active", high, 0, log)
    return s.handshake("node", 2, infos)


# ---------------------------------------------------------------------------------------------- until now
NEW_BRANCH = (FE(11, 30), *LOG0)
LOWER_CASES = [
    # desc, reconnect high, log at reconnect, expected end of partition 0, lowered_ends
    ("same branch, more items: the goal stays", 80, LOG0, 50, {}),
    ("new branch with fewer items: lowered to its high seqno", 30, NEW_BRANCH, 30, {0: 50}),
    ("new branch that already passed the end: the goal stays", 60, NEW_BRANCH, 50, {}),
    ("new branch exactly at the end", 50, NEW_BRANCH, 50, {}),
    ("same branch reporting less (no branch: not lowered)", 30, LOG0, 50, {}),
]


@pytest.mark.parametrize("desc,high,log,end,lowered", LOWER_CASES, ids=[c[0] for c in LOWER_CASES])
def test_until_now_end_lowered_only_after_a_branch(desc, high, log, end, lowered):
    s = ClientSession(start="beginning", until_now=True)
    s.handshake("node", 2, INFOS)
    assert reconnect(s, high, log) == [req(0, 0, 0, 0, 0, end), req(1, 0, 0, 0, 0, 9)]
    assert s.lowered_ends == lowered


def test_lowered_twice_keeps_the_first_end():
    s = ClientSession(start="beginning", until_now=True)
    s.handshake("node", 2, INFOS)
    reconnect(s, 30, NEW_BRANCH)
    assert reconnect(s, 20, (FE(12, 20), *NEW_BRANCH))[0].end_seqno == 20
    assert s.lowered_ends == {0: 50}


def test_explicit_end_seqnos_are_never_lowered():
    s = ClientSession(start="beginning", end_seqnos={0: 50})
    s.handshake("node", 2, INFOS)
    assert reconnect(s, 30, NEW_BRANCH)[0].end_seqno == 50
    assert s.lowered_ends == {}


def test_finished_partitions_are_left_alone():
    s = ClientSession(start="beginning", until_now=True)
    s.handshake("node", 2, INFOS)
    s.stream_end(0, "end_seqno_reached", 50)
    assert reconnect(s, 30, NEW_BRANCH) == [req(1, 0, 0, 0, 0, 9)]
    assert s.lowered_ends == {}
