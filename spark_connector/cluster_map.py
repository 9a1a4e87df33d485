"""Which node serves each partition, and what a task does when its node stops serving one.

A cluster's partitions each have one active node, named by the partition map (``GET /cluster``
from any node).  The source reads every partition's metadata and items from its active, as a
Couchbase DCP client reads a vBucket from its active and Kafka's source reads a topic partition
from its leader.  The map moves (failover, rebalance), so a task that meets ``not_my_partition``,
a ``state_changed`` stream end or a lost connection reads the map again and resumes that
partition on its new active from what it already delivered: offsets are per partition, never per
node.  A branch on the new active (a failover that lost unreplicated items) is met by the usual
rollback rules, never followed silently (``reachable_end``).

Pure: the decisions here are fed documents and positions; ``meta`` and ``task`` do the I/O.
A server started without ``--cluster`` answers ``GET /cluster`` with 404 and is its own map: every
partition is read from it, as before clusters existed.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.protocol import messages as M
from engine.protocol.client.routing import MapFormatError, MapView

from .planning import WorkItem
from .retry import Retryable

__all__ = ["Fault", "Progress", "NoActiveNode", "routes_from_map", "split_routes", "fault_of_end",
           "fault_of_refusal", "resume_item", "reachable_end", "parse_map"]


class NoActiveNode(Retryable):
    """The map names no live active node for a partition (a failover in progress): retried."""


class Fault(str, enum.Enum):
    """Why a task's stream on one node stopped before its planned end."""

    MOVED = "moved"              # state_changed / not_my_partition: the partition has a new active
    LOST = "connection_lost"     # the node could not be reached or the connection dropped
    FATAL = "fatal"              # anything else: the batch fails, naming the cause


def parse_map(body: Any) -> MapView:
    """A ``GET /cluster`` answer as the consumer's ``MapView``; a malformed one may be a node
    mid-start, so it is retried rather than fatal."""
    try:
        return MapView.from_cluster_json(body)
    except MapFormatError as exc:
        raise Retryable(str(exc)) from None


def split_routes(view: MapView, partitions: Iterable[int]) -> tuple[dict[int, str], dict[int, str]]:
    """(partition -> base URL of its active node, partition -> why it has none) over the wanted
    partitions: no active, its node down or without a URL, or not in the map at all."""
    routes: dict[int, str] = {}
    unserved: dict[int, str] = {}
    for p in sorted(partitions):
        if p not in view.actives:
            unserved[p] = (f"partition {p} is not in the cluster map (revision {view.revision}, "
                           f"{view.num_partitions} partitions)")
            continue
        node, url = view.url_of(p)
        if url is None:
            what = "no active node" if node is None else f"its active node {node} is down"
            unserved[p] = f"partition {p} has {what} in map revision {view.revision}"
            continue
        routes[p] = url
    return routes, unserved


def routes_from_map(view: MapView, partitions: Iterable[int]) -> dict[int, str]:
    """Partition -> base URL of its active node, for every wanted partition.

    ``NoActiveNode`` names the first partition without one (no active, or its node is down or
    has no URL): a failover is under way and the caller retries with a fresh map."""
    routes, unserved = split_routes(view, partitions)
    if unserved:
        raise NoActiveNode(unserved[min(unserved)])
    return routes


_MOVED_ENDS = {M.StreamEndReason.STATE_CHANGED.value}
#: a node going away (restart, drain) or dropping a consumer it found too slow: reconnect, maybe elsewhere
_LOST_ENDS = {M.StreamEndReason.SHUTTING_DOWN.value, M.StreamEndReason.TOO_SLOW.value}


def fault_of_end(reason: str) -> Fault:
    """A stream that ended before its planned end with ``reason``: which fault it is."""
    if reason in _MOVED_ENDS:
        return Fault.MOVED
    if reason in _LOST_ENDS:
        return Fault.LOST
    return Fault.FATAL


def fault_of_refusal(status: str) -> Fault:
    """A stream request answered with ``status`` (not ok, not rollback): which fault it is."""
    return Fault.MOVED if status == M.StreamStatus.NOT_MY_PARTITION.value else Fault.FATAL


@dataclass(frozen=True, slots=True)
class Progress:
    """What a task delivered of one work item: items through ``seqno`` (exclusive start of what
    is left), inside the snapshot ``snap`` (None: no item yet), on branch ``uuid`` (the branch
    the server confirmed when it accepted the stream); ``done``: the item reached its end."""

    seqno: int
    snap: tuple[int, int] | None
    uuid: int
    done: bool = False
    reset: bool = False   # a reset row was delivered for this item (restreamed from 0)


def resume_item(item: WorkItem, progress: Progress | None) -> WorkItem | None:
    """The work item that carries on from ``progress`` on another connection, or None when
    ``item`` is finished.

    Nothing delivered yet: the item as planned (its control row, if any, was already yielded by
    ``read_task``).  Otherwise a resume from the last delivered item, a partial snapshot when it
    was not the snapshot's last (the server's rollback rule then decides, as for any consumer)."""
    if progress is None:
        return item
    if progress.done or progress.seqno >= item.end:
        return None
    if progress.snap is None:
        if not progress.reset:
            return item
        # restreamed from 0 after a reset row: carry on from 0 on the branch that exists
        return replace(item, uuid=progress.uuid, start=0, snap_start=0, snap_end=0, control=None,
                       open_snapshot=False)
    a, b = progress.snap
    s = progress.seqno
    snap = (s, s) if s >= b else (min(a, s), b)
    return replace(item, uuid=progress.uuid, start=s, snap_start=snap[0], snap_end=snap[1], control=None,
                   open_snapshot=False)


def reachable_end(log: Sequence[tuple[int, int]], high_seqno: int, branch_uuid: int | None, end: int) -> int:
    """The highest seqno up to ``end`` that a node with failover log ``log`` (newest first,
    (uuid, seqno) pairs) and ``high_seqno`` holds on the branch ``branch_uuid`` the batch was
    planned on.

    A batch planned on a node that then failed may end past where the new active's history
    branched off (items it never received): its items past that point are a different history,
    so the read stops at the branch point and the next planning step meets the branch through
    the rollback rules.  A branch the log does not know is left to the server (it answers the
    stream request with a rollback)."""
    if branch_uuid is None:
        return end
    for i, (uuid, _) in enumerate(log):
        if uuid == branch_uuid:
            limit = high_seqno if i == 0 else log[i - 1][1]
            return min(end, limit)
    return end
