"""A node's copies follow the newest map (engine.cluster.roles): one table."""
from __future__ import annotations

import pytest

from engine.cluster.partition_map import PartitionMap, Placement
from engine.cluster.roles import Change, RoleChange, changes, role_of
from engine.core.types import PartitionState as S

MAP = PartitionMap(3, (Placement("n1", ("n2",)), Placement("n2", ("n1",)), Placement("n3", ("n2",))))


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ((S.ACTIVE, S.REPLICA, S.DEAD), []),  # already as the map says
        ((S.REPLICA, S.REPLICA, S.DEAD), [RoleChange(0, Change.PROMOTE)]),  # failover to this copy
        ((S.DEAD, S.REPLICA, S.DEAD), [RoleChange(0, Change.ACTIVATE)]),
        ((S.PENDING, S.REPLICA, S.DEAD), [RoleChange(0, Change.ACTIVATE)]),
        ((S.ACTIVE, S.ACTIVE, S.DEAD), [RoleChange(1, Change.BECOME_REPLICA)]),  # came back after a failover
        ((S.ACTIVE, S.DEAD, S.DEAD), [RoleChange(1, Change.BECOME_REPLICA)]),
        ((S.ACTIVE, S.REPLICA, S.ACTIVE), [RoleChange(2, Change.RETIRE)]),  # a fresh data dir is all active
        ((S.ACTIVE, S.REPLICA, S.REPLICA), [RoleChange(2, Change.RETIRE)]),
    ],
)
def test_changes_for_n1(states, expected) -> None:
    assert changes(MAP, "n1", states) == expected


def test_an_unplaced_map_changes_nothing() -> None:
    assert changes(PartitionMap.empty(3), "n1", (S.ACTIVE, S.ACTIVE, S.ACTIVE)) == []


def test_role_of() -> None:
    assert [role_of(MAP, "n2", p) for p in range(3)] == [S.REPLICA, S.ACTIVE, S.REPLICA]
    assert [role_of(MAP, "n9", p) for p in range(3)] == [S.DEAD, S.DEAD, S.DEAD]
