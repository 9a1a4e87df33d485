"""What a node does to its own partitions when a new partition map arrives.

The map says, per partition, who is active and who holds replicas; the node's engine says what
state each of its copies is in.  ``changes`` turns the difference into engine calls, one per
partition, so the node's copies follow the newest map it has seen (fencing by map: a node
serves writes for a partition only while that map names it active):

=========================  ===========  ==================================================
map says for this node     engine now   change
=========================  ===========  ==================================================
active                     active       none
active                     replica      ``PROMOTE``: failover, a new history branch at the
                                        last whole snapshot (``Engine.promote``)
active                     dead/pending ``ACTIVATE``: the node is given the partition back
                                        (``Engine.set_state``; a branch at its high seqno)
replica                    replica      none
replica                    other        ``BECOME_REPLICA``: it streams from the active, which
                                        rolls it back if its history went elsewhere
no copy                    not dead     ``RETIRE``: dead, so writes and streams stop at once
=========================  ===========  ==================================================

A map of revision 0 (the cluster was just created and has placed nothing) changes nothing.
Pure: tested with tables in tests/cluster/test_roles.py.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from engine.cluster.partition_map import PartitionMap
from engine.core.types import PartitionState

__all__ = ["Change", "RoleChange", "role_of", "changes"]


class Change(enum.StrEnum):
    PROMOTE = "promote"
    ACTIVATE = "activate"
    BECOME_REPLICA = "become_replica"
    RETIRE = "retire"


@dataclass(frozen=True, slots=True)
class RoleChange:
    partition: int
    change: Change


def role_of(current: PartitionMap, node: str, partition: int) -> PartitionState:
    """The state the map gives ``node``'s copy of ``partition``."""
    placement = current.placements[partition]
    if placement.active == node:
        return PartitionState.ACTIVE
    if node in placement.replicas:
        return PartitionState.REPLICA
    return PartitionState.DEAD


def changes(current: PartitionMap, node: str, states: Sequence[PartitionState]) -> list[RoleChange]:
    """The engine calls that bring ``states`` (per partition) to what ``current`` gives ``node``."""
    if current.revision == 0:
        return []
    out = []
    for p, state in enumerate(states):
        wanted = role_of(current, node, p)
        if wanted is state:
            continue
        if wanted is PartitionState.ACTIVE:
            out.append(RoleChange(p, Change.PROMOTE if state is PartitionState.REPLICA else Change.ACTIVATE))
        elif wanted is PartitionState.REPLICA:
            out.append(RoleChange(p, Change.BECOME_REPLICA))
        else:
            out.append(RoleChange(p, Change.RETIRE))
    return out
