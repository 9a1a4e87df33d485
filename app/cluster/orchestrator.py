"""The orchestrator's loop: observe etcd, take one pure step, publish what it decided.

Runs on every node; only the elected one acts.  Each cycle reads the live nodes, the map and
the replicas' progress at one etcd revision, calls ``engine.cluster.orchestration.step`` and,
if the map changes, publishes it guarded by the map's revision and the orchestrator's key.
A lost race is not an error: the next cycle observes the winner's map.  The transaction also
checks that every node the step treated as gone is still without a key: a node that rejoins
creates its key before it reads the map, so either it reads the new map, or the new map (which
may have failed it over on the strength of its absence) is not published.  Each decision is
logged once, naming the partition, the node and the seqno, as Patroni names each HA cycle's
decision.

With the node's watch behind it (``ProgressView``), a cycle reads etcd only when the watch saw a
change since its last reading, or when this orchestrator wrote something, or once every
``reread_s`` as a safety net: the tick of an idle cluster is a step on what is known, not a
round of reads on etcd and on every node's loop.

How long each node has been gone is observed here, on this process's monotonic clock: a node
of the map without a live lease is noted gone at the first cycle that sees it so, forgotten
when it is live again, and handed to the step with ``replace_after_s`` (the grace before its
replica slots are filled elsewhere).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from app.cluster.election import Election
from app.cluster.etcd import Compare, EtcdClient, EtcdError
from app.cluster.handover import HandoverDriver
from app.cluster.layout import Layout
from app.cluster.mapstore import MapStore
from app.cluster.outage import Outage
from app.cluster.progress_view import ProgressView, parse_progress
from app.cluster.membership import ClusterSettings
from app.cluster.rebalance import RebalanceDriver
from engine.cluster.orchestration import ClusterView, Decision, step
from engine.cluster.partition_map import PartitionMap

log = logging.getLogger("upr.cluster")


class Orchestrator:
    def __init__(self, etcd: EtcdClient, layout: Layout, settings: ClusterSettings, election: Election, *,
                 auto_failover: bool = True, tick_s: float = 0.5, initial_nodes: int = 1,
                 replace_after_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 auto_rebalance: bool = False,
                 on_decision: Callable[[Decision], None] | None = None,
                 note: Callable[..., None] | None = None, progress: ProgressView | None = None,
                 reread_s: float = 5.0) -> None:
        self.etcd, self.layout, self.settings, self.election = etcd, layout, settings, election
        #: the node's watched view of the replicas' progress, which also wakes the cycles (None:
        #: this orchestrator watches and reads the progress itself)
        self.progress_view = progress
        self.maps = MapStore(etcd, layout)
        self.auto_failover = auto_failover
        self.initial_nodes = initial_nodes
        self.tick_s = tick_s
        self.on_decision = on_decision
        self.replace_after_s = replace_after_s
        self.clock = clock
        #: node -> when a cycle first saw it in the map without a live lease
        self.gone_since: dict[str, float] = {}
        self._reported: set[tuple[int, str]] = set()
        #: graceful failovers, advanced in cycles where the step itself changed no map
        self.handover = HandoverDriver(etcd, layout, self.maps, election.guard)
        #: the operator's rebalance: it holds the partitions it moves out of the step's reach
        self.rebalance = RebalanceDriver(etcd, layout, self.maps, election.guard, note=note)
        #: a node joining a placed cluster starts a rebalance on its own (else it waits for one)
        self.auto_rebalance = auto_rebalance
        #: the live nodes and the map as last read, the watch's mark before that reading and
        #: when it was taken: reused while the mark is unchanged (see the module's docstring)
        self.reread_s = reread_s
        self._read: tuple[frozenset[str], PartitionMap, int] | None = None
        self._read_mark: tuple[int, int] | None = None
        self._read_at = 0.0
        self._moves_mark: tuple[int, int] | None = None

    async def run(self) -> None:
        """Campaign, then run cycles until cancelled.  etcd being away only delays both."""
        outage = Outage(f"orchestrator campaign of {self.election.name}")
        while True:
            try:
                await self.election.campaign()
                outage.ok()
                break
            except EtcdError as exc:
                outage.failed(exc)
                await asyncio.sleep(self.tick_s)
        changed = asyncio.Event()
        view = self.progress_view
        if view is not None:
            view.subscribe(changed)
            watcher = None
        else:
            watcher = asyncio.create_task(self._watch(changed))
        outage = Outage(f"orchestrator {self.election.name}")
        try:
            while True:
                # cleared before the cycle reads, not after: a change written while the cycle
                # runs (a source recording its fence) wakes the next cycle at once instead of
                # waiting out the tick, which every handover's write pause would pay
                changed.clear()
                try:
                    await self.cycle()
                    outage.ok()
                except EtcdError as exc:
                    outage.failed(exc)
                try:
                    async with asyncio.timeout(self.tick_s):
                        await changed.wait()
                except asyncio.TimeoutError:
                    pass
        finally:
            if watcher is not None:
                watcher.cancel()
            if view is not None:
                view.unsubscribe(changed)

    def _forget_reading(self) -> None:
        """What this orchestrator wrote is read back next cycle, not awaited from the watch."""
        self._read = None

    async def observe(self) -> tuple[ClusterView, int]:
        view = self.progress_view
        watched = view is not None and view.ready
        mark = view.mark() if view is not None else None
        now = self.clock()
        if (watched and self._read is not None and mark == self._read_mark
                and now - self._read_at < self.reread_s):
            live, current, mod_revision = self._read
        else:
            # independent reads, at once: each round trip is paid by every handover's write pause
            reads = [self.etcd.get_prefix(self.layout.nodes), self.maps.load(self.settings.partitions)]
            if not watched:
                reads.append(self.etcd.get_prefix(self.layout.progress))
            (nodes, _), (current, mod_revision), *read = await asyncio.gather(*reads)
            live = frozenset(self.layout.node_name(kv.key) for kv in nodes)
            self._read, self._read_mark, self._read_at = (live, current, mod_revision), mark, now
        if watched:
            assert view is not None
            progress = view.snapshot()
        else:
            progress = {self.layout.progress_owner(kv.key): parse_progress(kv.value) for kv in read[0][0]}
        gone = current.nodes() - live
        for node in gone - self.gone_since.keys():
            log.warning("node %s is gone (no live lease); its replica slots are kept for %.0f s", node,
                        self.replace_after_s)
        self.gone_since = {node: self.gone_since.get(node, now) for node in gone}
        view = ClusterView(current, live, self.settings.replicas, progress, auto_failover=self.auto_failover,
                           initial_nodes=self.initial_nodes, gone_since=dict(self.gone_since), now=now,
                           replace_after_s=self.replace_after_s)
        return view, mod_revision

    async def cycle(self) -> Decision:
        # the moves' keys are read beside the cluster's, not after: one round of etcd reads per
        # cycle, which a handover waiting for its switch pays
        shared = self.progress_view
        if shared is not None:
            # the node's watch stands in for the drivers' own: they read only after a change
            # under their prefixes (or a restarted watch) since their last reading
            moves = (shared.readings, shared.moves) if shared.ready else None
            self.rebalance.watched = self.handover.watched = moves is not None
            if moves != self._moves_mark:
                self.rebalance.dirty = self.handover.dirty = True
                self._moves_mark = moves
        (view, mod_revision), _, _ = await asyncio.gather(self.observe(), self.rebalance.read(), self.handover.read())
        try:
            decision = await self.act(view, mod_revision)
        except BaseException:
            self._forget_reading()
            raise
        if decision.new_map is not None or self.handover.dirty or self.rebalance.dirty:
            self._forget_reading()  # it wrote, or something is in motion
        return decision

    async def act(self, view: ClusterView, mod_revision: int) -> Decision:
        """Take the step on what was observed and publish its map, unless the map, the
        orchestrator key or a gone node's absence changed since (then nothing is published)."""
        moving, observed = await self.rebalance.observe(view)
        view = replace(view, hold=moving.hold, excluded=observed.ejected)
        decision = step(view)
        if decision.new_map is not None:
            still_gone = [Compare(self.layout.node(n), "create", 0) for n in sorted(view.map.nodes() - view.live_nodes)]
            won = await self.maps.publish(decision.new_map, mod_revision, [self.election.guard(), *still_gone])
            if not won:
                log.info("map revision %d, the orchestrator or a gone node changed meanwhile; observing again",
                         view.map.revision)
                return Decision(based_on=decision.based_on)
            for promoted in decision.promotions:
                log.warning("failover: partition %d promoted on node %s at seqno %d%s", promoted.partition,
                            promoted.node, promoted.seqno, " (forced)" if promoted.forced else "")
            log.info("published map revision %d", decision.new_map.revision)
        for gone in decision.unavailable:
            if (gone.partition, gone.reason) not in self._reported:
                log.error("partition %d is unavailable: %s", gone.partition, gone.reason)
                self._reported.add((gone.partition, gone.reason))
        if decision.new_map is None:
            await self.handover.cycle(view, mod_revision)
            await self.rebalance.carry_out(moving, observed, view, mod_revision)
            if self.auto_rebalance:
                await self.rebalance.start_for_joined(view, observed)
        if self.on_decision is not None:
            self.on_decision(decision)
        return decision

    async def _watch(self, changed: asyncio.Event) -> None:
        root = self.layout.prefix.rstrip("/").encode()
        prefix = root + b"/"
        moves = (root + b"/rebalance/", root + b"/handover/")
        while True:
            try:
                _, revision = await self.etcd.get_prefix(prefix)
                # whatever changed while no watch ran is read again
                self.rebalance.dirty = self.handover.dirty = True
                self.rebalance.watched = self.handover.watched = True
                changed.set()
                async for event in self.etcd.watch_prefix(prefix, revision + 1):
                    if event.kv.key.startswith(moves):
                        self.rebalance.dirty = self.handover.dirty = True
                    changed.set()
            except EtcdError:
                self.rebalance.watched = self.handover.watched = False
                await asyncio.sleep(self.tick_s)
