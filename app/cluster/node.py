"""A node in a cluster: membership, the orchestrator loop, the map watcher and fencing.

What runs, all on the server's event loop, from the app's lifespan (``app.main``):

* **membership** (``app.cluster.membership``): the node's key under a kept-alive lease;
* **the orchestrator** (``app.cluster.orchestrator``): every node campaigns, one acts;
* **the map watcher**: one watch of the cluster's prefix.  The replicas' progress reports, the
  most frequent change by far, are applied from the watch's events (``ProgressView``: read in
  full only when the watch starts); a new map and the handover records are followed from their
  events too (the event is the whole news: a takeover's pause pays for no read of etcd, and a
  rebalance costs no full read per step on every node); any other change triggers a refresh
  (coalesced, so a burst costs one) that reads the live nodes, the map and the orchestrator,
  then makes the engine
  follow the newest map (``engine.cluster.roles``: promote, activate, become replica, retire)
  and starts or stops the replication streams (``app.cluster.replication``).  A map is only ever
  replaced by a newer revision: a watcher that reads an old one late does not go back.  The
  orchestrator on this node is woken by the same watch and reads the progress from the same view:
  by every change but a progress report that moved only a seqno while no partition is moving
  (nothing it decides on then depends on a seqno; a failover reads the latest one in the view);
* **fencing**: when the lease is found gone, every active partition becomes dead *first*, so
  no write is accepted for a partition the orchestrator may already have given to another
  copy; then the node joins again under a new lease and follows the map like a new node.  A
  node that was not running when its lease was due (paused) fences its actives at once, on
  the loop, before it reads a request that waited (``Membership.on_stalled``), and follows the
  map again if etcd says the lease is still held.  A fenced active becomes a replica copy (it
  takes no writes, and if the map gave the partition away it streams from the new active and
  rolls back); if the map still gives it the partition at the revision it was fenced at, nobody
  else took writes meanwhile and it becomes active again keeping its failover log
  (``Engine.take_over``): an etcd blip that cost every lease forks no history.

Before the first map (revision 0) the node serves nothing: every copy is dead until the map
names it, so two nodes started on fresh data dirs never both take writes for a partition.

Routing helpers for the HTTP layer: ``misdirected(partition)`` (who is active, for a 421) and
``view()`` (``GET /cluster``).
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from app import events
from app.cluster.durable import DurableWrites
from app.cluster.election import Election
from app.cluster.errors import ClusterError, DuplicateNode
from app.cluster.etcd import EtcdClient, EtcdError
from app.cluster.handover import HandoverParticipant
from app.cluster.layout import Layout
from app.cluster.mapstore import MapStore
from app.cluster.membership import ClusterSettings, Membership, join_settings
from app.cluster.orchestrator import Orchestrator
from app.cluster.outage import Outage
from app.cluster.progress_view import ProgressView
from app.cluster.rebalance import RebalanceStore
from app.cluster.replication import ReplicationStreams
from app.cluster.switch_trace import SwitchTrace
from engine.cluster.partition_map import PartitionMap
from engine.cluster.promotion import ReplicaProgress
from engine.cluster.roles import Change, changes
from engine.core.types import PartitionState
from engine.engine import Engine

log = logging.getLogger("upr.cluster")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    name: str
    url: str
    endpoints: tuple[str, ...]
    prefix: str
    partitions: int
    replicas: int
    lease_ttl_s: int = 3
    initial_nodes: int = 1
    replica_replace_after_s: float = 60.0
    #: bearer token presented to the other nodes (replication streams need the admin role)
    token: str | None = None
    #: a node joining a placed cluster starts a rebalance (else it holds nothing until one)
    auto_rebalance: bool = False


async def preflight(config: NodeConfig) -> None:
    """Check, before anything is served or written locally, that this node may join: etcd is
    reachable, the cluster's fixed settings match (a new cluster gets them), the name is free.
    Raises ``ClusterError``/``EtcdError`` whose message is the one line to print."""
    etcd = EtcdClient(list(config.endpoints))
    layout = Layout(config.prefix)
    try:
        await join_settings(etcd, layout, ClusterSettings(config.partitions, config.replicas))
        holder = await etcd.get(layout.node(config.name))
        if holder is not None:
            other = json.loads(holder.value).get("url", "?")
            raise DuplicateNode(f"node name {config.name!r} is already used by a live node at {other}")
    finally:
        await etcd.aclose()


def replica_sources(pmap: PartitionMap, me: str, urls: dict[str, str]) -> dict[int, tuple[str, str]]:
    """The copies ``me`` replicates per ``pmap``: partition -> (its active, the active's URL).

    A partition whose active died stays listed (at the URL it was last seen at) until the map
    moves it: dropping it would drop the copy's catch-up state and withdraw its progress from
    etcd, and the orchestrator, looking for the dead active's in-sync replicas at that very
    moment, would find none and leave the partition unavailable."""
    sources = {}
    for p, placement in enumerate(pmap.placements):
        if me in placement.replicas and placement.active is not None and placement.active in urls:
            sources[p] = (placement.active, urls[placement.active])
    return sources


class ClusterNode:
    def __init__(self, engine: Engine, config: NodeConfig) -> None:
        self.engine = engine
        self.config = config
        self.name = config.name
        self.layout = Layout(config.prefix)
        self.etcd = EtcdClient(list(config.endpoints))
        self.settings = ClusterSettings(config.partitions, config.replicas)
        self.maps = MapStore(self.etcd, self.layout)
        self.map = PartitionMap.empty(config.partitions)
        #: live nodes (their key exists under a lease): name -> URL
        self.nodes: dict[str, str] = {}
        #: every node's URL as last seen live (a dead active's too: see ``replica_sources``)
        self._urls: dict[str, str] = {}
        #: the replicas' progress, applied from the watch's events (``_watch``)
        self.progress_view = ProgressView(self.layout)
        #: a change other than progress was watched: the next refresh reads the cluster again
        self._stale = True
        root = self.layout.prefix.rstrip("/")
        #: keys that exist while partitions move (graceful failover, rebalance): their handovers
        #: wait for a replica's seqno, so every progress report matters to the orchestrator then
        self._moving_prefixes = (f"{root}/handover/".encode(), f"{root}/rebalance/request".encode())
        #: handover records: the watch's events carry all a node follows of them (no refresh)
        self._records_prefix = f"{root}/handover/partitions/".encode()
        #: keys the orchestrator's handover and rebalance drivers read (``ProgressView.saw``)
        self._move_prefixes = (f"{root}/handover/".encode(), f"{root}/rebalance/".encode())
        self.orchestrator: str | None = None
        self.fenced = False
        #: partitions fenced while active, and the map revision they were fenced at
        self._fenced_actives: set[int] = set()
        self._fenced_revision = -1
        self.membership: Membership | None = None
        # cut off from a live active for twice its lease TTL and more, a copy is out of sync: longer
        # than a dead active's lease takes to expire, so a dead active's replicas stay promotable
        self.replication = ReplicationStreams(engine, self.name, self.etcd, self.layout, self._lease,
                                              max_down_s=2.0 * config.lease_ttl_s + 1.0,
                                              is_live=lambda node: node in self.nodes, token=config.token,
                                              ack_at_once=lambda p: self.handover.taking_over(p))
        #: durable writes of the partitions this node is active for, fed by its replicas' acks
        self.durable = DurableWrites(engine, self.name, is_live=lambda node: node in self.nodes)
        self._orchestrator_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        #: a follow pass is scheduled and has not started yet (``_follow_soon``)
        self._follow_queued = False
        self._apply_lock = asyncio.Lock()
        #: graceful failover: where this node stops writes or takes over (``app.cluster.handover``)
        self.handover = HandoverParticipant(self.etcd, self.layout, engine, self.name, acked=self._replica_received,
                                            on_ack=self.durable.add_advance_listener,
                                            on_switched=lambda raw, _revision: self._map_event(raw))
        #: a benchmark's stamps of each switch transaction (``UPR_SWITCH_TRACE=1``), else None
        self.handover.switch_trace = SwitchTrace.from_env()
        #: the operator's rebalance requests (``/cluster/rebalance``); the orchestrator carries them out
        self.rebalance = RebalanceStore(self.etcd, self.layout)
        self._changed = asyncio.Event()
        #: (map revision, monotonic time) of the last map taken from a watch event or this node's
        #: own switch: a takeover logs how long after it the partition took writes
        self._map_arrived: tuple[int, float] = (0, 0.0)

    def _replica_received(self, node: str, partition: int) -> int | None:
        ack = self.durable.replica_ack(node, partition)
        return ack.received if ack is not None else None

    def _lease(self) -> int:
        return self.membership.lease if self.membership is not None else 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.handover.switch_trace is not None:
            self.handover.switch_trace.start()
        await join_settings(self.etcd, self.layout, self.settings)
        await self._retire_all()  # nothing is served until the newest map says so
        await self._join()
        await self.refresh()
        self._tasks = [asyncio.create_task(self._watch(), name="cluster watch"),
                       asyncio.create_task(self._refresher(), name="cluster refresh")]

    async def stop(self) -> None:
        tasks = [*self._tasks]
        if self._orchestrator_task is not None:
            tasks.append(self._orchestrator_task)
        await self._cancel_until_done(tasks)
        await self.handover.aclose()
        if self.handover.switch_trace is not None:
            await self.handover.switch_trace.aclose()
        await self.replication.aclose()
        if self.membership is not None:
            try:
                await self.membership.leave()
            except EtcdError as exc:
                log.warning("node %s: could not revoke its lease at shutdown: %s", self.name, exc)
        await self.etcd.aclose()

    async def _cancel_until_done(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Cancel ``tasks`` and wait for them, cancelling again those still running after a
        second: a task that caught one cancel (a library that swallows it) must not hold the
        node's shutdown for ever."""
        pending = {task for task in tasks if not task.done()}
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
            if pending:
                log.warning("node %s: still running after a cancel, cancelled again: %s", self.name,
                            ", ".join(sorted(task.get_name() for task in pending)))
        for task in tasks:  # retrieved, as ``gather`` would: a task's own error ends with it here
            if not task.cancelled():
                task.exception()

    async def _join(self) -> None:
        self.membership = Membership(self.etcd, self.layout, self.name, self.config.url, ttl=self.config.lease_ttl_s,
                                     on_lost=self._lost, on_stalled=self._stalled, on_held=self._held)
        await self.membership.join()
        election = Election(self.etcd, self.layout, self.name, self.membership.lease)
        orchestrator = Orchestrator(self.etcd, self.layout, self.settings, election, tick_s=0.25,
                                    initial_nodes=self.config.initial_nodes,
                                    replace_after_s=self.config.replica_replace_after_s,
                                    auto_rebalance=self.config.auto_rebalance,
                                    note=functools.partial(events.rebalance, self.engine),
                                    progress=self.progress_view)
        self._orchestrator_task = asyncio.create_task(orchestrator.run(), name="orchestrator")

    # ------------------------------------------------------------------ fencing
    def _lost(self) -> None:
        self.fenced = True
        self._tasks.append(asyncio.get_running_loop().create_task(self._fence_and_rejoin(), name="fence"))

    def _stalled(self) -> None:
        # On the loop and blocking on purpose: no request that waited during the stall may be
        # served by an active partition the orchestrator may have given away meanwhile.
        self.fenced = True
        for p in self._actives():
            self._fence(p)
        self.durable.retire_all("this node was not running when its lease was due (fenced)")

    def _held(self) -> None:
        self.fenced = False
        self._refresh_soon()  # follow the map again: what it still gives this node becomes active

    async def _fence_and_rejoin(self) -> None:
        async with self._apply_lock:  # after a map being followed right now, before anything else
            retired = 0
            for p in self._actives():
                await asyncio.to_thread(self._fence, p)
                retired += 1
            self.durable.retire_all("this node lost its cluster lease (fenced)")
        log.error("node %s lost its lease: %d active partition(s) stopped taking writes; rejoining", self.name, retired)
        self.replication.update({})
        if self._orchestrator_task is not None:
            self._orchestrator_task.cancel()
        while True:
            try:
                await self._join()
                break
            except (EtcdError, ClusterError) as exc:
                log.warning("node %s: rejoining the cluster failed (retrying): %s", self.name, exc)
                await asyncio.sleep(0.5)
        self.fenced = False
        self._refresh_soon()

    def _actives(self) -> list[int]:
        return [p for p in range(self.engine.num_partitions) if self.engine.state(p) is PartitionState.ACTIVE]

    def _fence(self, partition: int) -> None:
        """Stop taking writes for an active ``partition`` now, able to resume without a new branch."""
        if not self._fenced_actives or self._fenced_revision != self.map.revision:
            self._fenced_actives, self._fenced_revision = set(), self.map.revision
        self.engine.set_state(partition, PartitionState.REPLICA)
        self._fenced_actives.add(partition)

    async def _retire_all(self) -> int:
        engine = self.engine
        active = [p for p in range(engine.num_partitions) if engine.state(p) is PartitionState.ACTIVE]
        for p in active:
            await asyncio.to_thread(engine.set_state, p, PartitionState.DEAD)
        return len(active)

    # ------------------------------------------------------------------ following the map
    @property
    def progress(self) -> dict[tuple[int, str], ReplicaProgress]:
        """The replicas' progress as last watched: (partition, node) -> what it holds."""
        return self.progress_view.progress

    async def _watch(self) -> None:
        prefix = self.layout.prefix.rstrip("/").encode() + b"/"
        view = self.progress_view
        outage = Outage(f"node {self.name}: watching the cluster")
        while True:
            try:
                # a new watch starts after the revision just read, and everything is taken from
                # that reading, so a change made while the watch was down is never missed
                kvs, revision = await self.etcd.get_prefix(prefix)
                outage.ok()
                view.reset([kv for kv in kvs if view.covers(kv.key)], revision)
                moving = {kv.key for kv in kvs if kv.key.startswith(self._moving_prefixes)}
                self._refresh_soon()
                view.notify()
                async for event in self.etcd.watch_prefix(prefix, revision + 1):
                    key = event.kv.key
                    if view.covers(key):
                        # no refresh: nothing this node follows depends on progress; the
                        # orchestrator is woken when a decision may depend on it: a copy came,
                        # went or changed its in-sync status, or a handover waits for a seqno
                        if view.apply(event) or moving:
                            view.notify()
                        continue
                    view.saw(move=key.startswith(self._move_prefixes))
                    record = self.handover.apply_event(event)
                    is_map = event.kind == "put" and key == self.layout.map
                    if is_map:
                        self._map_event(event.kv.value)
                    if key.startswith(self._moving_prefixes):
                        if event.kind == "delete":
                            moving.discard(key)
                        else:
                            moving.add(key)
                    if record:
                        # the event is the news: follow it, without reading the cluster again
                        self._follow_soon("handover record")
                    elif not is_map and not key.startswith(self._records_prefix):
                        self._refresh_soon()
                    view.notify()
            except EtcdError as exc:
                outage.failed(exc)
            view.lost()  # until the next watch's reading, whoever needs progress reads it
            await asyncio.sleep(0.25)

    def _map_event(self, raw: bytes) -> None:
        """A new map in a watch event, or the one this node just published as a handover's
        source: follow it at once, before the full refresh's reads (a handover's target takes
        over and its source starts redirecting one etcd round trip sooner).  The handover records it is followed with are as new as the event
        (``HandoverParticipant.apply_event``), so a takeover is never mistaken for a failover."""
        try:
            new = PartitionMap.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError):
            self._refresh_soon()  # reads it again and says what is wrong
            return
        if new.num_partitions != self.config.partitions:
            self._refresh_soon()
            return
        if new.revision <= self.map.revision:
            return
        self.map = new
        self._map_arrived = (new.revision, time.monotonic())
        self.handover.map_seen(new)  # after ``self.map``: the writes it releases get 421s naming the new active
        self._follow_soon("map event")

    def _follow_soon(self, why: str) -> None:
        """Follow what the node knows now, on a task; a burst of events that arrives before that
        task has started costs one pass (the pass reads the newest map and records)."""
        if self._follow_queued:
            return
        self._follow_queued = True
        task = asyncio.create_task(self._follow_quietly(), name=f"cluster follow ({why})")
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    async def _follow_quietly(self) -> None:
        self._follow_queued = False  # an event from now on gets a pass of its own
        try:
            await self._follow()
        except Exception:  # a full refresh retries it (and logs what keeps failing)
            log.debug("node %s: following a watched change failed; a refresh retries", self.name, exc_info=True)
            self._refresh_soon()

    def _refresh_soon(self) -> None:
        self._stale = True
        self._changed.set()

    async def _refresher(self) -> None:
        outage = Outage(f"node {self.name}: reading the cluster")
        while True:
            await self._changed.wait()
            self._changed.clear()
            if not self._stale:
                continue
            self._stale = False
            try:
                await self.refresh()
                outage.ok()
            except EtcdError as exc:
                outage.failed(exc)
                await asyncio.sleep(0.25)
                self._refresh_soon()
            except Exception:
                log.exception("node %s: following the map failed (retrying)", self.name)
                await asyncio.sleep(0.25)
                self._refresh_soon()
            await asyncio.sleep(0.02)  # coalesce bursts into one refresh

    async def refresh(self) -> None:
        """Read the cluster's state from etcd and make this node follow the newest map.  The
        replicas' progress is read here only until the watch has taken its first reading."""
        view = self.progress_view
        reads = [self.etcd.get_prefix(self.layout.nodes), self.maps.load(self.config.partitions),
                 self.etcd.get(self.layout.orchestrator), self.handover.load()]
        if not view.ready:
            reads.append(self.etcd.get_prefix(self.layout.progress))
        # independent reads, at once: a takeover's write pause pays for every round trip here
        (node_kvs, _), (current, mod), holder, _, *progress = await asyncio.gather(*reads)
        await self.handover.as_new_as(mod)  # a map is followed with records at least as new
        self.nodes = {self.layout.node_name(kv.key): json.loads(kv.value)["url"] for kv in node_kvs}
        self._urls.update(self.nodes)
        if progress and not view.ready:
            view.show(progress[0][0])
        self.orchestrator = holder.value.decode() if holder is not None else None
        if current.revision >= self.map.revision:
            self.map = current
        await self._follow()

    async def _follow(self) -> None:
        async with self._apply_lock:
            if self.fenced:
                return
            # one map for the whole pass: a watch event may replace ``self.map`` while this pass
            # awaits, and the states set, the durable writes' map and the replica streams must
            # all come from the same map (the newer one gets a pass of its own)
            pmap = self.map
            engine = self.engine
            states = [engine.state(p) for p in range(engine.num_partitions)]
            # durable writes learn the map first: a partition that becomes active below takes
            # writes from then on (the loop yields between partitions), and a majority write
            # accepted there must find it counted as ours, not be answered ambiguous at once
            self.durable.follow_map(pmap)
            # a handover's target takes over first: its partition's writes are paused (and held
            # here by ``until_active``) until it does, the other changes cost no one a pause
            ordered = sorted(changes(pmap, self.name, states),
                             key=lambda c: not (c.change is Change.PROMOTE and self.handover.takes_over(c.partition)))
            staged = False  # a takeover's stored state waits for the end of the pass (``take_over``)
            for change in ordered:
                if self.fenced:  # stalled past the lease meanwhile: nothing becomes active now
                    break
                p = change.partition
                resumed = p in self._fenced_actives and self._fenced_revision == pmap.revision
                self._fenced_actives.discard(p)
                if change.change is Change.PROMOTE and self.handover.takes_over(p):
                    started = time.monotonic()
                    # active in memory only: the held writes go now, the state commit after them;
                    # on this thread unless the writer lock is busy (no I/O, no wait)
                    if not engine.take_over(p, commit=False, wait=False):
                        await asyncio.to_thread(engine.take_over, p, commit=False)
                    staged = True
                    self.handover.taken_over_soon(p)
                    revision, arrived = self._map_arrived
                    now = time.monotonic()
                    # the wait to follow the map, then the engine's own step (in memory; its commit follows)
                    after = (f", {(now - arrived) * 1000:.0f} ms after the map came, "
                             f"{(now - started) * 1000:.0f} ms of them in take_over") if revision == pmap.revision else ""
                    log.warning("node %s: partition %d taken over as active (map revision %d%s), failover log kept",
                                self.name, p, pmap.revision, after)
                elif change.change is Change.PROMOTE and resumed:
                    # fenced while active and the map never moved: nobody else took writes for it
                    await asyncio.to_thread(engine.take_over, p)
                    log.warning("node %s: partition %d active again after the fence (map revision %d unchanged, "
                                "history kept)", self.name, p, pmap.revision)
                elif change.change is Change.PROMOTE:
                    entry = await asyncio.to_thread(engine.promote, p)
                    self.handover.became_active(p)
                    log.warning("node %s: partition %d promoted to active (map revision %d): new history branch "
                                "%d at seqno %d", self.name, p, pmap.revision, entry.uuid, entry.seqno)
                elif change.change is Change.ACTIVATE:
                    await asyncio.to_thread(engine.set_state, p, PartitionState.ACTIVE)
                    self.handover.became_active(p)
                elif change.change is Change.BECOME_REPLICA:
                    await asyncio.to_thread(engine.set_state, p, PartitionState.REPLICA)
                else:
                    await asyncio.to_thread(engine.set_state, p, PartitionState.DEAD)
                if self.fenced and engine.state(p) is PartitionState.ACTIVE:  # fenced while it ran
                    await asyncio.to_thread(self._fence, p)
            if staged:
                # one commit for the pass's takeovers (unless a flush carries them first), off the
                # follow lock: the next map's takeover must not wait for this fsync
                task = asyncio.create_task(self._commit_states(), name="cluster: commit taken-over states")
                self._tasks.append(task)
                task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)
            if not self.fenced:
                await self.handover.follow(pmap)
            self.durable.follow_map(pmap)
            # a copy whose active just died keeps streaming until the map moves the partition
            # (``replica_sources``): dropping it would withdraw the progress the orchestrator promotes by
            self.replication.update(replica_sources(pmap, self.name, self._urls))

    async def _commit_states(self) -> None:
        try:
            await asyncio.to_thread(self.engine.commit_states)
        except Exception as exc:  # staged still: the next write transaction (a flush) carries it
            log.warning("node %s: committing the taken-over partitions' states failed (the next flush "
                        "carries them): %s", self.name, exc)

    # ------------------------------------------------------------------ routing and status
    def misdirected(self, partition: int) -> dict[str, Any]:
        """Who serves ``partition`` according to the newest map (for a 421 or ``not_my_partition``)."""
        active = self.map.active_of(partition) if 0 <= partition < self.map.num_partitions else None
        if active == self.name:
            # this node's switch of the partition is in etcd's hands: the target holds the write
            active = self.handover.switching_to(partition) or active
        return {"active": active, "url": self.nodes.get(active) if active else None,
                "map_revision": self.map.revision}

    def view(self) -> dict[str, Any]:
        """``GET /cluster``: nodes, the map with each replica's progress, the orchestrator.

        A replica's ``lag`` (seqnos behind its active) is known on the active's node, which
        holds the high seqno and the replica's acks (``seqno_ack``: received and persisted);
        elsewhere it is null.  Without an ack on the current stream the lag comes from the
        progress the replica publishes in etcd."""
        names = sorted(set(self.nodes) | self.map.nodes())
        nodes = [{"name": n, "state": "up" if n in self.nodes else "down", "url": self.nodes.get(n)} for n in names]
        partitions = []
        engine = self.engine
        for p, placement in enumerate(self.map.placements):
            replicas = []
            for r in placement.replicas:
                prog = self.progress.get((p, r))
                lag = ack = None
                if placement.active == self.name:
                    ack = self.durable.replica_ack(r, p)
                    if ack is not None:
                        lag = max(engine.high_seqno(p) - ack.received, 0)
                    elif prog is not None:
                        lag = max(engine.high_seqno(p) - prog.seqno, 0)
                acked = {"received_seqno": None, "persisted_seqno": None, "persist_lag": None}
                if ack is not None:
                    acked = {"received_seqno": ack.received, "persisted_seqno": ack.persisted,
                             "persist_lag": max(engine.high_seqno(p) - ack.persisted, 0)}
                replicas.append({"node": r, "seqno": prog.seqno if prog else None,
                                 "in_sync": bool(prog and prog.in_sync), "lag": lag, **acked})
            partitions.append({"partition": p, "active": placement.active, "replicas": replicas})
        return {"node": self.name, "fenced": self.fenced, "orchestrator": self.orchestrator, "nodes": nodes,
                "map": {"revision": self.map.revision, "partitions": partitions}}
