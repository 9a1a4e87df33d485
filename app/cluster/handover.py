"""Graceful failover's adapters: the requests and records in etcd, the orchestrator's driver and
each node's part.  The decisions are ``engine.cluster.handover``'s; this module moves them.

Keys, beside ``app.cluster.layout``'s (no lease: a request outlives the node that took it, and a
record must survive an orchestrator change mid-handover)::

    <prefix>/handover/requests/<node>     HandoverRequest JSON: empty this node of actives
    <prefix>/handover/partitions/<p>      Handover JSON: partition p on its way

Who writes what: an operator (through any node's ``POST /cluster/failover``) puts and deletes a
request; the orchestrator creates records, calls them off, switches the map and marks requests
refused or deletes them when done; a source node adds ``fenced_at`` once its writes stopped; a
target deletes its record once it has taken over.  Every update of a record compares the mod
revision it was read at, so a record called off is never brought back by a late writer.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from app.cluster.etcd import Compare, Delete, EtcdClient, Put
from app.cluster.layout import Layout
from app.cluster.mapstore import MapStore
from engine.cluster.handover import Handover, HandoverRequest, HandoverView, advance, takes_over
from engine.cluster.orchestration import ClusterView
from engine.cluster.partition_map import PartitionMap
from engine.cluster.rebalance import REBALANCE
from engine.core.types import PartitionState
from engine.engine import Engine

log = logging.getLogger("upr.cluster")

__all__ = ["HandoverStore", "HandoverDriver", "HandoverParticipant", "Stored"]


@dataclass(frozen=True, slots=True)
class Stored:
    """A record with the etcd mod revision it was read at (what an update compares)."""

    handover: Handover
    mod_revision: int


class HandoverStore:
    def __init__(self, etcd: EtcdClient, layout: Layout) -> None:
        self.etcd = etcd
        root = layout.prefix.rstrip("/")
        self._requests = f"{root}/handover/requests/".encode()
        self._partitions = f"{root}/handover/partitions/".encode()

    def request_key(self, node: str) -> bytes:
        return self._requests + node.encode()

    def record_key(self, partition: int) -> bytes:
        return self._partitions + str(partition).encode()

    async def requests(self) -> dict[str, HandoverRequest]:
        kvs, _ = await self.etcd.get_prefix(self._requests)
        out = {}
        for kv in kvs:
            request = HandoverRequest.from_json(json.loads(kv.value))
            out[request.node] = request
        return out

    async def records(self) -> dict[int, Stored]:
        kvs, _ = await self.etcd.get_prefix(self._partitions)
        out = {}
        for kv in kvs:
            handover = Handover.from_json(json.loads(kv.value))
            out[handover.partition] = Stored(handover, kv.mod_revision)
        return out

    async def ask(self, request: HandoverRequest) -> None:
        """Store an operator's request (replacing a refused one for the same node)."""
        await self.etcd.put(self.request_key(request.node), _dumps(request.to_json()))

    async def withdraw(self, node: str) -> bool:
        """Delete ``node``'s request; handovers not yet switched are then called off."""
        return await self.etcd.delete(self.request_key(node)) > 0

    async def update(self, stored: Stored, new: Handover | None) -> bool:
        """Replace (or, with None, delete) a record if it is still as read; False if it changed."""
        key = self.record_key(stored.handover.partition)
        op = Put(key, _dumps(new.to_json())) if new is not None else Delete(key)
        return (await self.etcd.txn([Compare(key, "mod", stored.mod_revision)], [op])).succeeded


class HandoverDriver:
    """The orchestrator's half: one ``advance`` per cycle, carried out against etcd."""

    def __init__(self, etcd: EtcdClient, layout: Layout, maps: MapStore, guard: Callable[[], Compare], *,
                 max_parallel: int = 4) -> None:
        self.store = HandoverStore(etcd, layout)
        self.etcd, self.maps, self.guard, self.max_parallel = etcd, maps, guard, max_parallel

    async def cycle(self, view: ClusterView, map_mod_revision: int) -> None:
        requests = await self.store.requests()
        # a rebalance's takeover records are the rebalance driver's to advance
        stored = {p: s for p, s in (await self.store.records()).items() if s.handover.kind != REBALANCE}
        if not requests and not stored:
            return
        step = advance(HandoverView(view.map, view.live_nodes, view.progress, requests,
                                    {p: s.handover for p, s in stored.items()}, self.max_parallel))
        for handover in step.start:
            key = self.store.record_key(handover.partition)
            created = await self.etcd.txn([Compare(key, "create", 0), self.guard()],
                                          [Put(key, _dumps(handover.to_json()))])
            if created.succeeded:
                log.warning("graceful failover: partition %d from node %s to node %s: stopping writes on %s",
                            handover.partition, handover.source, handover.target, handover.source)
        for handover, reason in step.cancel:
            if await self.store.update(stored[handover.partition], None):
                log.warning("graceful failover of partition %d from node %s called off (%s): it takes writes "
                            "again", handover.partition, handover.source, reason)
        for handover in step.forget:
            await self.store.update(stored[handover.partition], None)
        if step.new_map is not None:
            if await self.maps.publish(step.new_map, map_mod_revision, [self.guard()]):
                for h in step.switched:
                    log.warning("graceful failover: partition %d is active on node %s from map revision %d "
                                "(node %s gave out up to seqno %s and stays a replica)", h.partition, h.target,
                                step.new_map.revision, h.source, h.fenced_at)
        for node in step.done:
            await self.etcd.txn([self.guard()], [Delete(self.store.request_key(node))])
            log.warning("graceful failover of node %s done: it is active for no partition", node)
        for node, reason in step.refuse:
            refused = HandoverRequest(node, requests[node].force, reason)
            await self.etcd.txn([self.guard()], [Put(self.store.request_key(node), _dumps(refused.to_json()))])
            log.error("graceful failover of node %s refused: %s", node, reason)


class HandoverParticipant:
    """A node's half: stop writes where it is a source, take over where it is a target."""

    def __init__(self, etcd: EtcdClient, layout: Layout, engine: Engine, node: str, *,
                 acked: Callable[[str, int], int | None] | None = None, ack_wait_s: float = 0.5) -> None:
        self.store = HandoverStore(etcd, layout)
        self.engine, self.node = engine, node
        self.records: dict[int, Stored] = {}
        #: (replica node, partition) -> what that replica's stream acknowledged holding, if known
        self.acked = acked
        self.ack_wait_s = ack_wait_s

    async def load(self) -> None:
        self.records = await self.store.records()

    def takes_over(self, partition: int) -> bool:
        """Whether this node's copy of ``partition``, which the map now makes active, is a
        handover's target holding everything its source gave out (then ``take_over``)."""
        stored = self.records.get(partition)
        _high, mark = self.engine.replica_mark(partition)
        return takes_over(stored.handover if stored else None, self.node, mark.complete_end)

    async def taken_over(self, partition: int) -> None:
        stored = self.records.pop(partition, None)
        if stored is not None:
            await self.store.update(stored, None)

    async def follow(self, current: PartitionMap) -> None:
        """Stop writes where a record makes this node a source (and say at which seqno); take
        them again where a paused partition has no record any more and the map still names
        this node active (the handover was called off); delete the records of takeovers done."""
        engine = self.engine
        fencing: dict[int, tuple[Stored, int]] = {}
        for p, stored in sorted(self.records.items()):
            h = stored.handover
            if h.target == self.node and current.active_of(p) == self.node and engine.state(p) is PartitionState.ACTIVE:
                await self.taken_over(p)  # taken over earlier, but deleting the record failed then
                continue
            if h.source != self.node or h.fenced_at is not None or current.active_of(p) != self.node:
                continue
            if engine.state(p) is not PartitionState.ACTIVE:
                continue
            fencing[p] = (stored, await asyncio.to_thread(engine.stop_writes, p))
        # the target streams from here: wait (briefly, all at once) for it to acknowledge the
        # last items, so the record says so and the switch need not wait for its progress report
        acked = await self._acks(fencing)
        for p, (stored, seqno) in sorted(fencing.items()):
            h = stored.handover
            if await self.store.update(stored, h.fenced(seqno, acked.get(p))):
                log.warning("node %s: partition %d stopped taking writes at seqno %d for its handover to node %s%s",
                            self.node, p, seqno, h.target, " (acknowledged by it)" if p in acked else "")
            else:
                await asyncio.to_thread(engine.resume_writes, p)  # called off meanwhile
        for p in range(engine.num_partitions):
            stored = self.records.get(p)
            if (engine.writes_stopped(p) and current.active_of(p) == self.node
                    and (stored is None or stored.handover.source != self.node)):
                await asyncio.to_thread(engine.resume_writes, p)
                log.warning("node %s: partition %d takes writes again (its handover was called off)", self.node, p)

    async def _acks(self, fencing: dict[int, tuple[Stored, int]]) -> dict[int, int]:
        """Partition -> the target's acknowledged seqno, for those whose target acknowledged the
        fenced seqno within ``ack_wait_s`` (polled: acks arrive on the stream's own task)."""
        if self.acked is None or not fencing:
            return {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ack_wait_s
        out: dict[int, int] = {}
        while True:
            for p, (stored, seqno) in fencing.items():
                got = self.acked(stored.handover.target, p)
                if got is not None and got >= seqno:
                    out[p] = got
            if len(out) == len(fencing) or loop.time() >= deadline:
                return out
            await asyncio.sleep(0.002)


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
