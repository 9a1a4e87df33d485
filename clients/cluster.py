"""A consumer of a cluster: one stream connection per node, following the partition map.

``Consumer`` asks the server it was given for ``GET /cluster``; when that answers a map, the
consumer's stream is driven from here (``ClusterStreams``).  What to open where, and when to read
the map again, is ``engine.protocol.client.routing.Router``'s decision; each connection is a
``NodeStream``, a ``Consumer`` bound to one node whose ``ClientSession`` follows the map (a
partition that is not active there comes back as ``PartitionMoved`` instead of a reconnect), so
handshakes, rollbacks, repairs, flow control and saving are exactly the single-node ones.

This module (the stream loop and the map reads) and its parts (``cluster_map``: reading the map;
``cluster_state``: the shared positions; ``cluster_moves``: which node stream holds which
partition; ``cluster_seek``; ``cluster_barriers``: the merged barrier) only move partitions
between node streams:

* **Positions do not depend on the node.**  Every node stream saves into one ``PartitionStates``
  (one state file, per partition checkpoints, no node id); a partition that moves resumes on its
  new node from its processed checkpoint, and the new active's failover log decides whether it
  rolls back (the session's rollback rules, the shared ring's keys).
* **Processed, not received.**  The node streams are read concurrently, but a node stream's next
  event is asked for only once the application asked for the event after the one it handed over,
  so an event counts as processed exactly as on one node.
* **Nothing is fatal that the map can fix.**  A lost connection, a partition refused or ended
  with ``state_changed``, a map without an active for a partition: the partition waits, the map
  is read again (from any node that answers), and it resumes where the map says.  Errors that no
  map fixes (a refused token, a corrupt position, a protocol violation) stop the consumer as on
  one node.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.routing import MapView, RouteAction, Router

from .cluster_barriers import ClusterBarriers
# MAP_GRACE_S and _StateView stay importable from here, where the consumer and tests look for them
from .cluster_map import MAP_GRACE_S, read_cluster_map, split_servers  # noqa: F401
from .cluster_moves import PartitionMoves
from .cluster_seek import ClusterSeeks
from .cluster_state import PartitionStates, _StateView  # noqa: F401
from .errors import AuthFailed, ConnectionFailed
from .events import BarrierReached, PartitionMoved


__all__ = ["ClusterStreams", "NodeLost", "PartitionStates", "read_cluster_map", "split_servers"]

log = logging.getLogger("upr.client")


class NodeLost(Exception):
    """A node stream's connection broke or would not open: its partitions follow the map."""


class ClusterStreams(ClusterBarriers, ClusterSeeks, PartitionMoves):
    """Drives a ``Consumer`` over a cluster (see the module docstring): the stream loop and the map
    reads here; barriers (``clients.cluster_barriers``), seeks (``clients.cluster_seek``) and which
    node stream holds which partition (``clients.cluster_moves``) in their own modules."""

    def __init__(self, owner: Any, seeds: Sequence[str], first: MapView, answered: str,
                 client: httpx.AsyncClient, node_stream: Any, map_refresh_s: float = 2.5) -> None:
        """``owner``: the ``clients.consumer.Consumer`` driven; ``node_stream``: the class of its
        node streams (``clients.consumer.NodeStream``, passed in: this module never imports it)."""
        self.owner = owner
        self.seeds = list(seeds)
        self.client = client
        self._good_url = answered
        session = owner.session
        self.router = Router(session.requested_partitions)
        self.states = PartitionStates(owner.state_store, session.saved, owner.ring, owner.commit_interval)
        if self.states.partition_count is None:
            self.states.partition_count = first.num_partitions or None
        self._first: MapView | None = first
        self._node_stream = node_stream
        self.streams: dict[int, list[Any]] = {}
        #: partitions whose start position was resolved by some node stream (later ones resume)
        self.opened: set[int] = set()
        #: ``until_now`` ends frozen at a partition's first handshake, carried to its next node
        self.ends: dict[int, int] = {}
        #: those ends with the branch they were measured on (``ClientSession.goals``): a new active
        #: whose history lost the last items lowers them as a reconnect on one node would
        self.goals: dict[int, tuple[int, int, int | None]] = {}
        self._events: deque[Any] = deque()
        #: router actions decided outside the stream loop (a seek reopening a finished partition)
        self._later: list[RouteAction] = []
        self._armed: dict[Any, asyncio.Task[Any]] = {}
        self._reload: asyncio.Task[MapView | None] | None = None
        self._retired = {"rollbacks": 0, "resets": 0, "corrections": 0, "items_processed": 0, "acked": 0}
        #: map reads in a row that no node answered (``max_reconnect_attempts`` bounds them)
        self._map_failures = 0
        self._current: Any = None  # the node stream whose event the application is handling
        #: pending barrier cookies: node stream -> the seqnos it returned (see ``request_barrier``)
        self.barriers: dict[str, dict[Any, dict[int, int]]] = {}
        #: cookies sent on each node stream
        self._sent: dict[Any, set[str]] = {}
        #: barrier cookies being sent (see ``_send_barriers``)
        self._sending: set[asyncio.Future[None]] = set()
        #: node streams closing in the background (see ``_close_conn``)
        self._closing: set[asyncio.Future[None]] = set()
        #: the map is read this often even when nothing happened: a hung node says nothing (the
        #: Couchbase SDKs poll their cluster config every 2.5 s by default for the same reason)
        self.map_refresh_s = map_refresh_s
        self._last_map_read = time.monotonic()
        self._reload_target = 0.0
        self._reading = False

    # ------------------------------------------------------------------ queries
    def live(self) -> list[Any]:
        return [s for streams in self.streams.values() for s in streams]

    def total(self, counter: str) -> int:
        if counter == "acked":
            live = sum(s.session.acks.acked_total for s in self.live())
        else:
            live = sum(getattr(s, counter) if counter in ("corrections", "items_processed")
                       else getattr(s.session, counter) for s in self.live())
        return self._retired[counter] + live

    def committed(self) -> dict[int, StreamOffset]:
        out = {p: cp.offset for p, cp in self.states.parts.items() if p in self.router.partitions}
        for s in self.live():
            out.update(s.session.committed())
        return out

    def holder(self, partition: int) -> Any | None:
        """The node stream that holds ``partition`` now (None: it waits for a node)."""
        for s in self.live():
            if partition in s.view.partitions:
                return s
        return None

    def position(self, partition: int) -> StreamOffset:
        """``partition``'s processed position, whichever node streams it (or none does now)."""
        s = self.holder(partition)
        if s is not None and partition in s.session.positions:
            return s.session.positions[partition].offset()
        cp = self.states.parts.get(partition)
        if cp is not None:
            return cp.offset
        return self.owner.session.offsets.get(partition, StreamOffset())

    def failover_log(self, partition: int) -> tuple[Any, ...]:
        """The failover log ``partition`` last streamed with (its current node's, once opened there)."""
        s = self.holder(partition)
        if s is not None and partition in s.session.positions:
            return s.session.positions[partition].failover_log
        cp = self.states.parts.get(partition)
        return cp.failover_log if cp is not None else ()

    async def partition_info(self, partition: int) -> dict[str, Any]:
        """``GET /partitions/{p}`` from the node ``partition`` streams from (else its active per the
        map): the copy whose history the stream follows."""
        s = self.holder(partition)
        if s is not None:
            return await s.http.partition(partition)
        view = self.router.map
        url = (view.url_of(partition)[1] if view is not None else None) or self._good_url
        what = f"GET /partitions/{partition} from {url}"
        try:
            resp = await self.client.get(f"{url}/partitions/{partition}", timeout=self.owner.open_timeout,
                                         headers={"Authorization": f"Bearer {self.owner.token}"} if self.owner.token else {})
        except httpx.HTTPError as exc:  # the client's typed error, as every other request of the consumer
            raise ConnectionFailed(f"{what}: {exc or type(exc).__name__}", partition=partition) from None
        if resp.status_code in (401, 403):
            raise AuthFailed(f"{what}: HTTP {resp.status_code}: the token is missing, unknown or lacks the read role",
                             field="token", partition=partition)
        if resp.status_code != 200:
            raise ConnectionFailed(f"{what}: HTTP {resp.status_code}", partition=partition)
        result: dict[str, Any] = resp.json()
        return result

    @property
    def done(self) -> bool:
        r = self.router
        return r.map is not None and bool(r.partitions) and all(p in r.done for p in r.partitions)

    # ------------------------------------------------------------------ commit, close
    async def commit(self) -> None:
        for s in self.live():
            if s is self._current:
                await s.commit()  # including the event being handled
            else:
                s._save()  # its last handed-over event was processed; a prefetched one is not

    async def close(self) -> None:
        await self._stop_waiting()
        for conn in list(self.streams):
            await self._close_conn(conn)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        self.states.save()

    # ------------------------------------------------------------------ the stream
    async def stream(self, per_item: bool) -> AsyncIterator[Any]:
        kind = "events" if per_item else "batches"
        try:
            if self._first is not None:
                first, self._first = self._first, None
                await self._apply(self.router.map_loaded(first, time.monotonic()))
            while True:
                if self._later:
                    later, self._later = self._later, []
                    await self._apply(later)
                while self._events:
                    yield self._events.popleft()
                if self.barriers:
                    reached = self._reached()
                    if reached is not None:
                        yield reached
                        self.owner._barrier_done(reached)
                        continue
                if self.done:
                    self.states.save()
                    return
                for s in self.live():
                    if s not in self._armed:
                        self._armed[s] = asyncio.ensure_future(s._iterator(kind).__anext__())
                at = self.router.reload_at
                if at is None:  # nothing pending: still look now and then (a hung node says nothing)
                    at = self._last_map_read + self.map_refresh_s
                if self._reload is not None and at < self._reload_target and not self._reading:
                    self._reload.cancel()  # the router wants the map sooner than the sleeping read
                    await asyncio.gather(self._reload, return_exceptions=True)
                    self._reload = None
                if self._reload is None:
                    self._reload_target = at
                    self._reload = asyncio.ensure_future(self._read_map_at(at))
                waiting: set[asyncio.Future[Any]] = set(self._armed.values())
                if self._reload is not None:
                    waiting.add(self._reload)
                if self.barriers and self._send_barriers():
                    # a node stream still opening gets the cookies once its handshake is done
                    waiting.add(asyncio.ensure_future(asyncio.sleep(0.02)))
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                self._current = None
                if self.owner._closed:  # close() from another task: stop, as on one node
                    return
                if not any(t in done for t in self._armed.values()) and (self._reload is None
                                                                         or self._reload not in done):
                    continue  # the barrier timer
                if self._reload is not None and self._reload in done:
                    task, self._reload = self._reload, None
                    await self._map_read(task)
                    continue
                # the node stream that waited longest first (re-armed streams go to the end)
                s = next(s for s, t in self._armed.items() if t in done)
                task = self._armed.pop(s)
                if task.cancelled():
                    continue
                try:
                    x = task.result()
                except StopAsyncIteration:
                    await self._finished(s)
                    continue
                except NodeLost as exc:
                    log.warning("consumer %s: connection to node %s lost (partitions %s): %s", self.owner.name,
                                s.node, sorted(s.view.partitions), exc)
                    self.owner.reconnects += 1  # its partitions open again where the map says
                    await self._apply(self.router.connection_lost(s.conn_id, time.monotonic()))
                    continue
                if type(x) is PartitionMoved:
                    x = dataclasses.replace(x, node=s.node)
                    await self._moved(s, x)
                elif type(x) is BarrierReached:
                    reached = self._barrier_returned(s, x)
                    if reached is None:
                        continue  # one node's part of a cluster barrier (or not ours)
                    self._current = s
                    yield reached
                    self.owner._barrier_done(reached)
                    continue
                self._current = s
                yield x
                self.owner.items_processed = self.total("items_processed")
        finally:
            self._current = None
            await self._stop_waiting()

    async def _stop_waiting(self) -> None:
        tasks = list(self._armed.values())
        if self._reload is not None:
            tasks.append(self._reload)
        self._armed.clear()
        self._reload = None
        self._reading = False
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ router actions
    # ------------------------------------------------------------------ the map
    async def _read_map_at(self, at: float) -> MapView | None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        self._reading = True
        urls = [self._good_url]
        view = self.router.map
        if view is not None:
            urls += sorted(u for u in view.urls.values() if u)
        urls += self.seeds
        ordered = list(dict.fromkeys(urls))
        found, url = await read_cluster_map(self.client, ordered, self.owner.token, self.owner.open_timeout)
        self._good_url = url
        return found

    async def _map_read(self, task: asyncio.Task[MapView | None]) -> None:
        self._reading = False
        now = self._last_map_read = time.monotonic()
        try:
            view = task.result()
        except AuthFailed:
            raise
        except ConnectionFailed as exc:
            self._map_failures += 1
            limit = self.owner.max_reconnect_attempts
            if limit is not None and self._map_failures > limit:  # as one node gives up reconnecting
                raise ConnectionFailed(f"no node of the cluster answered the partition map {self._map_failures} "
                                       f"times in a row: {exc}") from None
            log.warning("consumer %s: cannot read the partition map: %s", self.owner.name, exc)
            await self._apply(self.router.map_failed(now))
            return
        self._map_failures = 0
        if view is None:  # that node left the cluster (or never was in one): ask the others
            await self._apply(self.router.map_failed(now))
            return
        await self._apply(self.router.map_loaded(view, now))
