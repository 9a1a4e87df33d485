"""Orchestrator election: a lease-backed key created only if absent (etcd's election recipe in
its smallest form, as in client/v3/concurrency/election.go).

The winner holds ``<prefix>/orchestrator`` under its node lease; when that node dies the key
goes with the lease and the waiting nodes race to create it again.  Leadership is never
assumed from memory: every map change the orchestrator publishes is guarded by the key still
being held under its lease (``MapStore.publish``), so a paused orchestrator that wakes after
losing the key cannot change anything.
"""
from __future__ import annotations

import logging

from app.cluster.etcd import Compare, Delete, EtcdClient, Get, Put
from app.cluster.layout import Layout

log = logging.getLogger("upr.cluster")


class Election:
    def __init__(self, etcd: EtcdClient, layout: Layout, name: str, lease: int) -> None:
        self.etcd, self.layout, self.name, self.lease = etcd, layout, name, lease

    async def campaign(self) -> None:
        """Return once this node holds the orchestrator key; wait for it to be free otherwise."""
        key = self.layout.orchestrator
        while True:
            result = await self.etcd.txn([Compare(key, "create", 0)], [Put(key, self.name.encode(), self.lease)],
                                         [Get(key)])
            if result.succeeded:
                log.info("%s is the orchestrator", self.name)
                return
            holder = result.reads[0][0] if result.reads and result.reads[0] else None
            if holder is not None and holder.lease == self.lease:
                return
            async for event in self.etcd.watch_prefix(key, result.revision + 1):
                if event.kind == "delete":
                    break

    async def holder(self) -> str | None:
        kv = await self.etcd.get(self.layout.orchestrator)
        return kv.value.decode() if kv is not None else None

    async def resign(self) -> None:
        key = self.layout.orchestrator
        await self.etcd.txn([Compare(key, "lease", self.lease)], [Delete(key)])

    def guard(self) -> Compare:
        """The condition every orchestrator write carries: the key is still ours."""
        return Compare(self.layout.orchestrator, "lease", self.lease)
