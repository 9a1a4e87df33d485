"""A node's presence in the cluster: the cluster's fixed settings, and a key under a lease that
is kept alive for as long as the node runs.

Fencing: when a keep-alive finds the lease gone (the node was paused or cut off longer than
the TTL), the node has already been given up by the orchestrator, which may have promoted
other copies.  ``Membership`` then sets ``lost`` and calls ``on_lost``; the node must stop
serving writes before it does anything else (Patroni demotes itself the same way).

A keep-alive's answer comes too late for a node that was paused: requests that waited in its
sockets would be served first.  So the lease also has a local deadline (``LeaseClock``), a
timer on the event loop: a paused node's timer fires as soon as it runs again, in the same
loop iteration that accepts the waiting connections and before any request is read, and calls
``on_stalled`` (stop taking writes now; etcd's answer follows: ``on_held`` or ``on_lost``).
When etcd itself is away the node keeps serving and says so once (``LeaseClock.ETCD_AWAY``);
when etcd answers again it says how long it was away.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from app.cluster.errors import ClusterMismatch, DuplicateNode, LeaseLost
from app.cluster.etcd import Compare, EtcdClient, EtcdError, Get, Put
from app.cluster.layout import Layout
from engine.cluster.lease_clock import LeaseClock, LeaseVerdict

log = logging.getLogger("upr.cluster")


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    partitions: int
    replicas: int

    def to_json(self) -> bytes:
        return json.dumps({"partitions": self.partitions, "replicas": self.replicas}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> ClusterSettings:
        data = json.loads(raw)
        return cls(int(data["partitions"]), int(data["replicas"]))


async def join_settings(etcd: EtcdClient, layout: Layout, wanted: ClusterSettings) -> ClusterSettings:
    """Create the cluster's settings if it is new, else check ``wanted`` against them."""
    result = await etcd.txn([Compare(layout.settings, "create", 0)], [Put(layout.settings, wanted.to_json())],
                            [Get(layout.settings)])
    if result.succeeded:
        return wanted
    stored = ClusterSettings.from_json(result.reads[0][0].value)
    if stored != wanted:
        raise ClusterMismatch(
            f"the cluster under {layout.prefix} has {stored.partitions} partitions and {stored.replicas} "
            f"replicas; this node was started with {wanted.partitions} and {wanted.replicas}"
        )
    return stored


class Membership:
    """Register ``name`` under a lease and keep it alive until ``leave``."""

    def __init__(self, etcd: EtcdClient, layout: Layout, name: str, url: str, *, ttl: int = 3,
                 on_lost: Callable[[], None] | None = None, on_stalled: Callable[[], None] | None = None,
                 on_held: Callable[[], None] | None = None) -> None:
        self.etcd, self.layout, self.name, self.url, self.ttl = etcd, layout, name, url, ttl
        self.on_lost, self.on_stalled, self.on_held = on_lost, on_stalled, on_held
        self.lease = 0
        self.lost = False
        #: stopped taking writes after a stall past the deadline, until etcd answers
        self.stalled = False
        self.clock = LeaseClock(stall_slack_s=max(ttl / 4, 0.25))
        #: when etcd was first found away (loop time), None while it answers
        self._away_since: float | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._keeper: asyncio.Task[None] | None = None

    async def join(self) -> None:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        self.lease, self.ttl = await self.etcd.grant(self.ttl)
        self.clock = LeaseClock(stall_slack_s=max(self.ttl / 4, 0.25))
        self.clock.renewed(sent, self.ttl)
        key = self.layout.node(self.name)
        value = json.dumps({"name": self.name, "url": self.url}).encode()
        result = await self.etcd.txn([Compare(key, "create", 0)], [Put(key, value, self.lease)], [Get(key)])
        if not result.succeeded:
            await self.etcd.revoke(self.lease)
            other = json.loads(result.reads[0][0].value).get("url", "?")
            raise DuplicateNode(f"node name {self.name!r} is already used by a live node at {other}")
        self._keeper = asyncio.create_task(self._keep_alive(), name=f"lease keeper {self.name}")
        self._arm(loop)
        log.info("joined the cluster under %s as %s (lease ttl %d s)", self.layout.prefix, self.name, self.ttl)

    async def leave(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        if self.lease and not self.lost:
            await self.etcd.revoke(self.lease)

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        interval = max(self.ttl / 3, 0.2)
        while True:
            # a slow answer leaves less of the lease: renew again before half of what is left
            left_s = (self.clock.deadline or 0.0) - loop.time()
            await asyncio.sleep(max(min(interval, left_s / 2), 0.0))
            sent = loop.time()
            self.clock.attempt(sent)
            try:
                # a paused etcd holds the request open: give up after a TTL and count it as away
                async with asyncio.timeout(self.ttl):
                    left = await self.etcd.keepalive(self.lease)
            except (EtcdError, asyncio.TimeoutError) as exc:
                self.clock.unreachable()
                if self._away_since is None:
                    self._away_since = sent
                    log.warning("node %s: etcd does not answer its lease keep-alive (%s); it keeps serving what "
                                "it owns while the lease may be valid", self.name, str(exc) or "timed out")
                continue
            if left <= 0:
                self.lost = True
                if self._deadline_timer is not None:
                    self._deadline_timer.cancel()
                log.error("%s", LeaseLost(f"node {self.name} lost its lease: it stops serving until it rejoins"))
                if self.on_lost is not None:
                    self.on_lost()
                return
            self.clock.renewed(sent, left)
            self._arm(loop)
            if self._away_since is not None:
                log.warning("node %s: etcd answers again after %.1f s; lease %x still held", self.name,
                            loop.time() - self._away_since, self.lease)
                self._away_since = None
            if self.stalled:
                self.stalled = False
                log.warning("node %s: lease %x still held after the stall; serving again", self.name, self.lease)
                if self.on_held is not None:
                    self.on_held()

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """(Re)schedule the deadline check for the current local deadline."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        if self.clock.deadline is not None:
            self._deadline_timer = loop.call_at(self.clock.deadline, self._at_deadline, loop)

    def _at_deadline(self, loop: asyncio.AbstractEventLoop) -> None:
        self._deadline_timer = None
        verdict = self.clock.verdict(loop.time())
        if verdict is LeaseVerdict.HOLDS:
            self._arm(loop)
        elif verdict is LeaseVerdict.STALLED and not self.lost and not self.stalled:
            self.stalled = True
            log.error("node %s was not running when its lease was due (%.1f s late): it stops taking writes "
                      "until etcd says whether lease %x is still held", self.name,
                      loop.time() - (self.clock.deadline or 0.0), self.lease)
            if self.on_stalled is not None:
                self.on_stalled()
        elif verdict is LeaseVerdict.ETCD_AWAY:
            log.warning("node %s: its lease is past its local deadline while etcd is away; it keeps serving "
                        "(no map can change without etcd, and etcd extends leases when it returns)", self.name)
