"""What a cluster consumer carries when a partition moves between node connections, as tables (no
sockets, no clock): "until now" goals follow the partition to its next node and are lowered there
if that node's history lost the goal (a failover); a finished partition that is sought is placed
again by the router."""
from __future__ import annotations

import pytest

from engine.core.types import FailoverEntry as FE
from engine.protocol.client.routing import MapView, Open, Router
from engine.protocol.client.session import ClientSession
from engine.protocol.messages import PartitionInfo

OLD_BRANCH = (FE(7, 0),)
NEW_BRANCH = (FE(9, 35), FE(7, 0))  # a failover at 35: a new uuid first


def first_node() -> ClientSession:
    s = ClientSession(partitions=[0, 1], start="beginning", until_now=True)
    s.follow_map = True
    s.handshake("n1", 2, {0: PartitionInfo("active", 50, 0, OLD_BRANCH), 1: PartitionInfo("active", 9, 0, OLD_BRANCH)})
    return s


GOAL_CASES = [
    # desc, the new node's high seqno, its failover log, partition 0's end there, lowered_ends
    ("same history, goal kept", 60, OLD_BRANCH, 50, {}),
    ("a failover kept every item: goal kept", 55, NEW_BRANCH, 50, {}),
    ("a failover lost the goal's last items: lowered to what exists", 40, NEW_BRANCH, 40, {0: 50}),
]


@pytest.mark.parametrize("desc,high,log,end,lowered", GOAL_CASES, ids=[c[0] for c in GOAL_CASES])
def test_until_now_goal_moves_with_its_partition(desc: str, high: int, log: tuple[FE, ...], end: int,
                                                 lowered: dict[int, int]) -> None:
    old = first_node()
    goals = old.goals([0])
    assert goals == {0: (50, 7, None)}
    # the partition's next connection: a resumed session given the goal (as clients.cluster does)
    new = ClientSession(partitions=[0], start="saved", end_seqnos={0: 50})
    new.adopt_goals(goals)
    [request] = new.handshake("n2", 2, {0: PartitionInfo("active", high, 0, log)})
    assert request.end_seqno == end and new.end_seqnos[0] == end
    assert new.lowered_ends == lowered
    assert new.goals([0])[0][2] == (lowered.get(0))  # carried again if it moves on


def test_a_lowered_goal_keeps_its_original_end_on_the_next_node() -> None:
    new = ClientSession(partitions=[0], start="saved", end_seqnos={0: 40})
    new.adopt_goals({0: (40, 9, 50)})
    new.handshake("n3", 2, {0: PartitionInfo("active", 45, 0, NEW_BRANCH)})
    assert new.end_seqnos[0] == 40 and new.lowered_ends == {0: 50}


def test_goals_name_only_until_now_partitions() -> None:
    s = ClientSession(partitions=[0, 1], start="beginning", end_seqnos={0: 5})
    s.handshake("n1", 2, {0: PartitionInfo("active", 50, 0, OLD_BRANCH), 1: PartitionInfo("active", 9, 0, OLD_BRANCH)})
    assert s.goals([0, 1]) == {}  # an explicit end is the caller's: never lowered


def test_a_sought_finished_partition_is_placed_again() -> None:
    r = Router()
    view = MapView(1, {0: "a", 1: "b"}, {"a": "http://a", "b": "http://b"})
    actions = r.map_loaded(view, 0.0)
    conn_b = next(a.conn for a in actions if type(a) is Open and a.node == "b")
    r.finished(conn_b, [1])
    assert 1 in r.done and r.waiting() == ()
    again = r.reopen(1, 1.0)
    assert [(a.node, a.partitions) for a in again if type(a) is Open] == [("b", (1,))]
    assert 1 not in r.done and r.node_of(1) == "b"
    assert r.reopen(1, 2.0) == []  # not finished: nothing to do
