"""A node's presence in the cluster: the cluster's fixed settings, and a key under a lease that
is kept alive for as long as the node runs.

Fencing: when a keep-alive finds the lease gone (the node was paused or cut off longer than
the TTL), the node has already been given up by the orchestrator, which may have promoted
other copies.  ``Membership`` then sets ``lost`` and calls ``on_lost``; the node must stop
serving writes before it does anything else (Patroni demotes itself the same way).
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
                 on_lost: Callable[[], None] | None = None) -> None:
        self.etcd, self.layout, self.name, self.url, self.ttl = etcd, layout, name, url, ttl
        self.on_lost = on_lost
        self.lease = 0
        self.lost = False
        self._keeper: asyncio.Task[None] | None = None

    async def join(self) -> None:
        self.lease, self.ttl = await self.etcd.grant(self.ttl)
        key = self.layout.node(self.name)
        value = json.dumps({"name": self.name, "url": self.url}).encode()
        result = await self.etcd.txn([Compare(key, "create", 0)], [Put(key, value, self.lease)], [Get(key)])
        if not result.succeeded:
            await self.etcd.revoke(self.lease)
            other = json.loads(result.reads[0][0].value).get("url", "?")
            raise DuplicateNode(f"node name {self.name!r} is already used by a live node at {other}")
        self._keeper = asyncio.create_task(self._keep_alive(), name=f"lease keeper {self.name}")
        log.info("joined the cluster under %s as %s (lease ttl %d s)", self.layout.prefix, self.name, self.ttl)

    async def leave(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        if self.lease and not self.lost:
            await self.etcd.revoke(self.lease)

    async def _keep_alive(self) -> None:
        interval = max(self.ttl / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            try:
                left = await self.etcd.keepalive(self.lease)
            except EtcdError as exc:
                # etcd unreachable: keep serving what we own; the lease may still be alive.
                log.warning("lease keep-alive failed for %s: %s", self.name, exc)
                continue
            if left <= 0:
                self.lost = True
                log.error("%s", LeaseLost(f"node {self.name} lost its lease: it stops serving until it rejoins"))
                if self.on_lost is not None:
                    self.on_lost()
                return
