"""``Consumer.seek`` on a cluster: the same rules as on one node, wherever the partition is now.

Mixed into ``clients.cluster.ClusterStreams``: a seek has to know which node stream holds the
partition, what it read ahead, whether the partition waits for a node or ended, and the shared
ring's floor, all of which that class keeps.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from engine.protocol.client.checkpoint import PartitionCheckpoint
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.position import PartitionPosition
from engine.protocol.client.routing import MapView, RouteAction, Router

from .cluster_state import PartitionStates
from .errors import UsageError
from .events import BarrierReached, PartitionMoved, StreamEnd

__all__ = ["ClusterSeeks"]


#: read-ahead events a seek does not drop: they are about the connection or the map, not the old stream
_KEPT_AHEAD = (PartitionMoved, BarrierReached, StreamEnd)


class ClusterSeeks:
    """The seek half of ``ClusterStreams`` (see the module docstring)."""

    owner: Any
    router: Router
    states: PartitionStates
    opened: set[int]
    ends: dict[int, int]
    _first: MapView | None
    _armed: dict[Any, asyncio.Task[Any]]
    _later: list[RouteAction]

    if TYPE_CHECKING:
        def holder(self, partition: int) -> Any | None: ...

    def seek(self, partition: int, offset: StreamOffset) -> None:
        """``Consumer.seek`` on a cluster: the same rules as on one node, wherever the partition is.

        * On a node stream: that stream's seek (a streaming partition reconnects to the same
          node; the other nodes' partitions are not touched), and an event of the partition that
          stream already read ahead is dropped: nothing of the old stream is handed over after this.
        * Waiting for a node (moved, unserved, not opened yet): its checkpoint becomes ``offset``,
          so whichever node streams it next starts there.
        * Its bounded stream ended: placed again, from ``offset``."""
        r = self.router
        first = self._first  # before the first iteration the router has not seen the map yet
        known = r.partitions or (r.wanted if r.wanted is not None else
                                 tuple(range(first.num_partitions)) if first is not None else ())
        if partition not in known:
            raise UsageError(f"partition {partition} is not one of the consumer's partitions", partition=partition)
        if not isinstance(offset, StreamOffset):
            raise UsageError(f"seek needs a StreamOffset, got {type(offset).__name__}", partition=partition,
                             field="offset")
        s = self.holder(partition)
        if s is not None and s.session.positions:
            s.seek(partition, offset)
            task = self._armed.get(s)
            if task is not None and task.done() and not task.cancelled() and task.exception() is None:
                ahead = task.result()
                if getattr(ahead, "partition", None) == partition and type(ahead) not in _KEPT_AHEAD:
                    del self._armed[s]  # its stream resumes with the seek (a reconnect or a new request)
            return
        end = self.ends.get(partition, self.owner.session.end_seqnos.get(partition))
        if end is not None and offset.seqno > end:
            raise UsageError(f"partition {partition}: cannot seek to seqno {offset.seqno}, after the stream's end "
                             f"{end}", partition=partition, seqno=offset.seqno, field="offset")
        if s is not None or partition not in self.opened:
            # not resolved by any handshake yet: a start offset like any other
            target = s.session if s is not None else self.owner.session
            target.offsets[partition] = offset
            self._forget_above(partition, offset, None)
        else:
            old = self.states.parts.get(partition)
            log = tuple(e for e in (old.failover_log if old is not None else ()) if e.seqno <= offset.seqno)
            moved = PartitionPosition(partition, offset, log)
            self.states.put(partition, PartitionCheckpoint(moved.offset(), moved.failover_log, moved.last_complete))
            self._forget_above(partition, offset, old.offset if old is not None else None)
        if partition in r.done:
            self._later.extend(r.reopen(partition, time.monotonic()))

    def _forget_above(self, partition: int, offset: StreamOffset, old: StreamOffset | None) -> None:
        """Nothing above ``offset`` counts as applied (the shared ring's rule of ``ClientSession.seek``)."""
        ring = self.owner.ring
        if ring is None:
            return
        model = ring.model
        model.drop_above(partition, offset.seqno)
        floor = model.floor(partition)
        if floor is None or floor > offset.seqno or old is None or offset.seqno > old.seqno:
            model.set_floor(partition, offset.seqno)
