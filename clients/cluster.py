"""A consumer of a cluster: one stream connection per node, following the partition map.

``Consumer`` asks the server it was given for ``GET /cluster``; when that answers a map, the
consumer's stream is driven from here (``ClusterStreams``).  What to open where, and when to read
the map again, is ``engine.protocol.client.routing.Router``'s decision; each connection is a
``NodeStream``, a ``Consumer`` bound to one node whose ``ClientSession`` follows the map (a
partition that is not active there comes back as ``PartitionMoved`` instead of a reconnect), so
handshakes, rollbacks, repairs, flow control and saving are exactly the single-node ones.

This module only moves partitions between node streams:

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
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import httpx

from engine.protocol.client.actions import StartMode
from engine.protocol.client.checkpoint import ConsumerState, PartitionCheckpoint
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.position import PartitionPosition
from engine.protocol.client.routing import (
    Close,
    MapFormatError,
    MapView,
    Open,
    RouteAction,
    Router,
    Unserved,
    revision_in,
)

from .errors import AuthFailed, ConnectionFailed, UsageError
from engine.protocol import messages as M

from .events import BarrierReached, PartitionMoved, PartitionsUnavailable, StreamEnd
from .redirects import parse_servers
from .state import StateStore


__all__ = ["ClusterStreams", "NodeLost", "PartitionStates", "read_cluster_map", "split_servers"]

log = logging.getLogger("upr.client")


#: read-ahead events a seek does not drop: they are about the connection or the map, not the old stream
_KEPT_AHEAD = (PartitionMoved, BarrierReached, StreamEnd)


def _all_streaming(s: Any) -> bool:
    """Every unfinished partition of node stream ``s`` has its stream requested (none waits for a
    rollback's or a repair's new request)."""
    session = s.session
    return all(p in session.open or p in session.finished for p in s.view.partitions)


class NodeLost(Exception):
    """A node stream's connection broke or would not open: its partitions follow the map."""


def split_servers(server: str | Sequence[str]) -> list[str]:
    """A cluster address: one URL, "URL,URL", or a list of URLs (any node will do); the same
    rules as the document commands' ``--server`` (``clients.redirects.parse_servers``)."""
    return list(parse_servers(server if isinstance(server, str) else ",".join(server)))


#: after the first node answered the map, how long the others may still answer with a newer one
MAP_GRACE_S = 0.05


async def read_cluster_map(client: httpx.AsyncClient, urls: Iterable[str], token: str | None,
                           timeout: float) -> tuple[MapView | None, str]:
    """``GET /cluster`` from every URL at once: (the newest map answered, the URL that answered
    it), or (None, URL) when no node answered a map and that one is not in a cluster (404).

    At once, because a hung node (paused, overloaded) accepts connections and answers nothing:
    asking one node after the other would wait out its timeout before asking the next.  The
    first map is kept once the others had ``MAP_GRACE_S`` more to answer, the newest revision
    winning (a node that has not caught up with etcd answers an older one).
    ``ConnectionFailed`` naming every URL when none answered; ``AuthFailed`` for a refused token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def one(url: str) -> tuple[str, Any]:
        try:
            resp = await client.get(f"{url}/cluster", headers=headers, timeout=timeout)
        except httpx.HTTPError as exc:
            return "error", f"{url}: {exc or type(exc).__name__}"
        if resp.status_code == 404:
            return "single", url
        if resp.status_code in (401, 403):
            raise AuthFailed(f"{url}/cluster: HTTP {resp.status_code}: the token is missing, unknown or lacks "
                             f"the read role", field="token")
        if resp.status_code != 200:
            return "error", f"{url}: HTTP {resp.status_code}"
        try:
            return "map", (MapView.from_cluster_json(resp.json()), url)
        except (MapFormatError, ValueError) as exc:
            return "error", f"{url}: {exc}"

    pending = {asyncio.ensure_future(one(url)) for url in dict.fromkeys(urls)}
    loop = asyncio.get_running_loop()
    maps: list[tuple[MapView, str]] = []
    singles: list[str] = []
    why: list[str] = []
    grace_until: float | None = None
    try:
        while pending:
            wait = None if grace_until is None else max(0.0, grace_until - loop.time())
            done, pending = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break  # the grace is over: the maps at hand will do
            for task in done:
                kind, value = task.result()
                if kind == "map":
                    maps.append(value)
                    if grace_until is None:
                        grace_until = loop.time() + MAP_GRACE_S
                elif kind == "single":
                    singles.append(value)
                else:
                    why.append(value)
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    if maps:
        return max(maps, key=lambda found: found[0].revision)
    if singles:
        return None, singles[0]
    raise ConnectionFailed("no node answered GET /cluster: " + "; ".join(sorted(why) or ["no URL"]))


class PartitionStates:
    """The consumer's one state, per partition, written by every node stream (see the module
    docstring); ``view(partitions)`` is the ``StateStore`` a node stream reads and writes.

    Writes to the store are coalesced to one per ``interval`` (after syncing the shared ring, so
    the state never claims items the ring could have lost): each write fsyncs on the event loop,
    and several node streams saving on their own would multiply those stalls.  The store only
    lags, never runs ahead of what was processed, so a crash resumes earlier, never later."""

    def __init__(self, store: StateStore, loaded: ConsumerState | None, ring: Any = None,
                 interval: float = 1.0) -> None:
        self.store = store
        self.ring = ring
        self.interval = interval
        self.parts: dict[int, PartitionCheckpoint] = dict(loaded.partitions) if loaded is not None else {}
        self.partition_count = loaded.partition_count if loaded is not None else None
        self._last_write = 0.0
        self._dirty = False
        self._timer: asyncio.TimerHandle | None = None

    def put(self, partition: int, checkpoint: PartitionCheckpoint) -> None:
        self.parts[partition] = checkpoint
        self.changed()

    def changed(self) -> None:
        """Some checkpoint moved: write now if the last write is ``interval`` old, else soon."""
        self._dirty = True
        wait = self.interval - (time.monotonic() - self._last_write)
        if wait <= 0:
            self.save()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(wait, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._dirty:
            try:
                self.save()
            except Exception:  # the next write retries; a timer callback has nobody to raise to
                log.exception("saving the consumer's positions failed")

    def save(self) -> None:
        """Write now (after syncing the ring)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.ring is not None:
            self.ring.sync()
        self.store.save(ConsumerState(dict(self.parts), None, self.partition_count))
        self._last_write = time.monotonic()
        self._dirty = False

    def view(self, partitions: Iterable[int]) -> "_StateView":
        return _StateView(self, set(partitions))


class _StateView:
    """A node stream's window on ``PartitionStates``: it reads and writes only its partitions."""

    def __init__(self, states: PartitionStates, partitions: set[int]) -> None:
        self.states = states
        self.partitions = partitions

    def load(self) -> ConsumerState | None:
        parts = {p: c for p, c in self.states.parts.items() if p in self.partitions}
        return ConsumerState(parts, None, self.states.partition_count)

    def save(self, state: ConsumerState) -> None:
        for p, cp in state.partitions.items():
            if p in self.partitions:
                self.states.parts[p] = cp
        if state.partition_count is not None:
            self.states.partition_count = state.partition_count
        self.states.changed()


class ClusterStreams:
    """Drives a ``Consumer`` over a cluster (see the module docstring)."""

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
        url = view.url_of(partition)[1] if view is not None else None
        resp = await self.client.get(f"{url or self._good_url}/partitions/{partition}", timeout=self.owner.open_timeout,
                                     headers={"Authorization": f"Bearer {self.owner.token}"} if self.owner.token else {})
        if resp.status_code != 200:
            raise ConnectionFailed(f"GET /partitions/{partition} from {url or self._good_url}: HTTP {resp.status_code}")
        result: dict[str, Any] = resp.json()
        return result

    # ------------------------------------------------------------------ seeks
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

    @property
    def done(self) -> bool:
        r = self.router
        return r.map is not None and bool(r.partitions) and all(p in r.done for p in r.partitions)

    # ------------------------------------------------------------------ barriers
    def request_barrier(self, cookie: str) -> None:
        """A cluster barrier: ``cookie`` goes on every node connection (and on every connection
        that opens while it is pending, for partitions that moved); it completes once every node
        stream holding partitions returned it and no wanted partition waits for a node.  Each node's
        barrier covers every write acknowledged there before the cookie arrived, so the merged
        vector is a cut of the whole cluster covering every write acknowledged before the request."""
        self.barriers[cookie] = {}
        self._send_barriers()

    def _send_barriers(self) -> bool:
        """Send pending cookies on node streams that are open; True if some stream is not open yet."""
        unopened = False
        for s in self.live():
            if s._conn is None or not _all_streaming(s):
                # its handshake is not done, or a partition of it is between a rollback answer and
                # its new request: send after (a node's barrier covers only partitions streaming
                # when the cookie arrives, so the new request must go first)
                unopened = True
                continue
            sent = self._sent.setdefault(s, set())
            for cookie in self.barriers:
                if cookie not in sent:
                    sent.add(cookie)
                    asyncio.ensure_future(s._send_quiet(M.Barrier(cookie)))
        return unopened

    def _barrier_returned(self, s: Any, event: BarrierReached) -> BarrierReached | None:
        returned = self.barriers.get(event.cookie)
        if returned is None:
            return None
        held = {p for p in s.view.partitions if p not in s.session.finished}
        if not held <= event.seqnos.keys():
            # some partition was not streaming there when the cookie arrived (its request was
            # answered with a rollback meanwhile): that node's cut does not cover it; ask again
            self._sent.get(s, set()).discard(event.cookie)
            return None
        returned[s] = {p: q for p, q in event.seqnos.items() if p in s.view.partitions}
        return self._completed(event.cookie)

    def _completed(self, cookie: str) -> BarrierReached | None:
        returned = self.barriers[cookie]
        if self.router.map is None or self.router.waiting():
            return None
        holders = [s for s in self.live() if s.view.partitions]
        if not all(s in returned for s in holders):
            return None
        del self.barriers[cookie]
        seqnos: dict[int, int] = {}
        for s in holders:
            seqnos.update(returned[s])
        return BarrierReached(cookie, dict(sorted(seqnos.items())))

    def _reached(self) -> BarrierReached | None:
        """A pending barrier that completed because streams closed or partitions moved."""
        for cookie in list(self.barriers):
            reached = self._completed(cookie)
            if reached is not None:
                return reached
        return None

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
        await self._apply(self.router.partition_moved(s.conn_id, p, time.monotonic(), revision_in(event.detail)))

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

