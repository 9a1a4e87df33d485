"""Which node stream holds which partition: opening streams where the router says, and handing a
partition on when it moves, its stream ends or its connection closes.

The bookkeeping a moved partition needs on its next node lives here: its processed checkpoint
(``PartitionStates``), whether some node already resolved its start (``opened``), its frozen
``until_now`` end and the branch that end was measured on (``ends``, ``goals``), and the counters
of streams that closed (``_retired``), so totals do not drop when a node stream goes.
Mixed into ``clients.cluster.ClusterStreams``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from engine.protocol.client.actions import StartMode
from engine.protocol.client.routing import Close, Open, RouteAction, Router, Unserved, revision_in, served_by_in

from .cluster_state import PartitionStates
from .events import PartitionMoved, PartitionsUnavailable

__all__ = ["PartitionMoves"]

log = logging.getLogger("upr.client")


class PartitionMoves:
    """The partition-ownership half of ``ClusterStreams`` (see the module docstring)."""

    owner: Any
    router: Router
    states: PartitionStates
    streams: dict[int, list[Any]]
    opened: set[int]
    ends: dict[int, int]
    goals: dict[int, tuple[int, int, int | None]]
    _events: Any
    _armed: dict[Any, asyncio.Task[Any]]
    _sent: dict[Any, set[str]]
    _closing: set[asyncio.Future[None]]
    _retired: dict[str, int]
    _current: Any
    _node_stream: Any

    async def _apply(self, actions: list[RouteAction]) -> None:
        for action in actions:
            kind = type(action)
            if kind is Open:
                self._open(action)  # type: ignore[arg-type]
            elif kind is Close:
                await self._close_conn(action.conn)  # type: ignore[union-attr]
            elif kind is Unserved:
                log.warning("consumer %s: partitions %s have no node serving them (%s); retrying",
                            self.owner.name, list(action.partitions), action.reason)  # type: ignore[union-attr]
                self._events.append(PartitionsUnavailable(action.partitions, action.reason))  # type: ignore[union-attr]

    def _open(self, action: Open) -> None:
        first = [p for p in action.partitions if p not in self.opened]
        resumed = [p for p in action.partitions if p in self.opened]
        log.info("consumer %s: streaming partitions %s from node %s (%s), map revision %d", self.owner.name,
                 list(action.partitions), action.node, action.url, self.router.revision)
        streams = []
        if first:
            streams.append(self._new_stream(action, first, initial=True))
        if resumed:
            streams.append(self._new_stream(action, resumed, initial=False))
        self.streams[action.conn] = streams

    def _new_stream(self, action: Open, partitions: list[int], *, initial: bool) -> Any:
        o = self.owner
        options = dict(o._options)
        session = o.session
        if initial:
            options.update(start=session.start, until_now=session.until_now,
                           offsets={p: off for p, off in session.offsets.items() if p in partitions},
                           end_seqnos={p: e for p, e in session.end_seqnos.items() if p in partitions})
        else:
            options.update(start=StartMode.SAVED, until_now=False, offsets=None,
                           end_seqnos={p: e for p, e in self.ends.items() if p in partitions} or None)
        stream = self._node_stream(action.conn, action.node, self.states.view(partitions), action.url,
                                   partitions=partitions, ring=o.ring, **options)
        if not initial:
            stream.session.adopt_goals({p: g for p, g in self.goals.items() if p in partitions})
        return stream

    async def _close_conn(self, conn: int) -> None:
        for s in self.streams.pop(conn, []):
            task = self._armed.pop(s, None)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            self._retire(s)
            self._sent.pop(s, None)
            if s.session.positions:
                s._save()  # its partitions' processed positions, before they open elsewhere
            s.view.partitions.clear()  # nothing it saves later is its business any more
            # The socket closes in the background: closing waits for the peer's answer, and a
            # hung node would stall every other partition's stream for the close timeout.
            closing = asyncio.ensure_future(self._close_quietly(s))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def _close_quietly(self, s: Any) -> None:
        try:
            await s.close()
        except Exception as exc:  # the partitions moved on; a failing close only needs a line
            log.info("consumer %s: closing the connection to node %s: %s", self.owner.name, s.node, exc)

    def _retire(self, s: Any) -> None:
        self.opened.update(s.session.positions)
        for p, end in s.session.end_seqnos.items():
            self.ends[p] = end
        self.goals.update(s.session.goals(s.session.end_seqnos))
        for name in ("rollbacks", "resets"):
            self._retired[name] += getattr(s.session, name)
        self._retired["corrections"] += s.corrections
        self._retired["items_processed"] += s.items_processed
        self._retired["acked"] += s.session.acks.acked_total
        if s is self._current:
            self._current = None

    async def _moved(self, s: Any, event: PartitionMoved) -> None:
        p = event.partition
        log.info("consumer %s: partition %d left node %s (%s); following the map", self.owner.name, p, s.node,
                 event.reason)
        end = s.session.end_seqnos.get(p)
        if end is not None:
            self.ends[p] = end
        self.goals.update(s.session.goals([p]))
        self.opened.add(p)
        checkpoint = s.session.release(p)
        s.view.partitions.discard(p)
        self.states.put(p, checkpoint)
        refused = event.reason == "not_my_partition"
        await self._apply(self.router.partition_moved(s.conn_id, p, time.monotonic(), revision_in(event.detail),
                                                      refused=refused, served_by=served_by_in(event.detail)))

    async def _finished(self, s: Any) -> None:
        """A node stream's bounded streams all reached their ends."""
        finished = [p for p in s.session.finished if p in s.view.partitions]
        streams = self.streams.get(s.conn_id, [])
        if s in streams:
            streams.remove(s)
            self._retire(s)
            self._sent.pop(s, None)
            await s.close()
        await self._apply(self.router.finished(s.conn_id, finished))
