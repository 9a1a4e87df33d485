"""Which replica takes over a partition whose active node is gone.

The rules, with the systems they come from:

* only a replica that is **in sync** may stand: one still catching up would silently drop
  acknowledged writes (Kafka's ISR with ``unclean.leader.election.enable=false``, Liftbridge,
  JetStream's "not switching to candidate, catching up");
* among them, the one holding the **highest complete snapshot** wins, so the fewest writes are
  taken back from consumers (UPR: the new failover entry is that seqno);
* ties go to the replica listed first in the map, so every node computes the same answer;
* an operator may **force** a promotion when no replica is in sync; it then takes the live
  replica with the highest seqno and says how much may be lost.

When nothing may stand, the answer is ``Unavailable`` with a reason a person can act on; the
partition stays without an active rather than being served from a copy that lost data.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from engine.cluster.partition_map import Placement


@dataclass(frozen=True, slots=True)
class ReplicaProgress:
    """What a replica holds, as its node last reported it.

    ``snapshot_seqno`` is the end of the last snapshot it received completely: the point a
    promotion forks history at.  ``in_sync`` means it had caught up with the active's high
    seqno and kept up since.
    """

    seqno: int
    in_sync: bool


@dataclass(frozen=True, slots=True)
class Promote:
    partition: int
    node: str
    #: the new failover entry's seqno: the last complete snapshot the new active holds.
    seqno: int
    forced: bool = False


@dataclass(frozen=True, slots=True)
class Unavailable:
    partition: int
    reason: str


def choose_successor(
    partition: int,
    placement: Placement,
    progress: Mapping[str, ReplicaProgress],
    live_nodes: Collection[str],
    *,
    force: bool = False,
) -> Promote | Unavailable:
    """Decide who becomes active for ``partition`` (whose active is gone) or why nobody can."""
    if not placement.replicas:
        return Unavailable(partition, "the partition has no replica")
    live = [n for n in placement.replicas if n in live_nodes]
    if not live:
        return Unavailable(partition, f"no replica is alive (replicas: {', '.join(placement.replicas)})")
    known = [n for n in live if n in progress]
    if not known:
        return Unavailable(partition, f"no live replica has reported its progress ({', '.join(live)})")
    in_sync = [n for n in known if progress[n].in_sync]
    candidates = known if force else in_sync
    if not candidates:
        behind = ", ".join(f"{n} catching up at seqno {progress[n].seqno}" for n in known)
        return Unavailable(partition, f"no replica is in sync ({behind}); force to promote anyway")
    best = max(candidates, key=lambda n: (progress[n].seqno, -placement.replicas.index(n)))
    return Promote(partition, best, progress[best].seqno, forced=force and best not in in_sync)
