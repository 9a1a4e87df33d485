"""Rebalance's adapters: the request, the removed-node marks and the outcome in etcd, and the
orchestrator's driver.  The decisions are ``engine.cluster.rebalance``'s; this module moves them.
Each node's part (stop writes, take over) is graceful failover's ``HandoverParticipant``, which
carries out a record whatever its kind.

Keys, beside ``app.cluster.layout``'s and graceful failover's (no lease: a rebalance outlives the
orchestrator that planned it)::

    <prefix>/rebalance/request          RebalanceRequest JSON (its plan, once fixed)
    <prefix>/rebalance/last             the outcome of the last run that ended: id, result, figures
    <prefix>/rebalance/ejected/<node>   node being or having been removed: no new copy goes there

Who writes what: an operator (any node's ``/cluster/rebalance``) puts the request (with the
marks of the nodes it removes), marks it stopped, or, to add a node back, deletes its mark; the
orchestrator stores the plan or the refusal, creates and calls off takeover records, publishes
the maps and, at the end, writes ``last`` and deletes the request in one transaction.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.cluster.etcd import Compare, Delete, EtcdClient, Put
from app.cluster.handover import HandoverStore, Stored
from app.cluster.layout import Layout
from app.cluster.mapstore import MapStore
from engine.cluster.orchestration import ClusterView
from engine.cluster.partition_map import PartitionMap
from engine.cluster.promotion import ReplicaProgress
from engine.cluster.rebalance import (REBALANCE, RebalanceRequest, RebalanceStep, RebalanceView, advance, moves_left,
                                      unplaced_nodes)

log = logging.getLogger("upr.cluster")

__all__ = ["RebalanceStore", "RebalanceDriver", "Observed", "progress_of", "Note"]

#: records one step on the node's event log: ``note(message, partition=..., node=..., **details)``
Note = Callable[..., None]


@dataclass(frozen=True, slots=True)
class Observed:
    """One read of the rebalance's etcd keys (request, removed nodes, takeover records), with the
    request's mod revision so that what is written back is guarded by what was seen."""
    request: RebalanceRequest | None
    mod_revision: int
    ejected: frozenset[str]
    records: dict[int, Stored]


class RebalanceStore:
    """The rebalance's keys in etcd: the operator's request (one at a time), the removed nodes
    and the last outcome.  It lives in etcd, not in the orchestrator, so a run survives the
    orchestrator's node and is resumed by the next one."""
    def __init__(self, etcd: EtcdClient, layout: Layout) -> None:
        self.etcd = etcd
        root = layout.prefix.rstrip("/")
        self.request_key = f"{root}/rebalance/request".encode()
        self.last_key = f"{root}/rebalance/last".encode()
        self._ejected = f"{root}/rebalance/ejected/".encode()
        self.handovers = HandoverStore(etcd, layout)

    def ejected_key(self, node: str) -> bytes:
        return self._ejected + node.encode()

    async def observe(self) -> Observed:
        kv, (marks, _), stored = await asyncio.gather(self.etcd.get(self.request_key),
                                                      self.etcd.get_prefix(self._ejected), self.handovers.records())
        request = RebalanceRequest.from_json(json.loads(kv.value)) if kv is not None else None
        records = {p: s for p, s in stored.items() if s.handover.kind == REBALANCE}
        return Observed(request, kv.mod_revision if kv is not None else 0,
                        frozenset(k.key[len(self._ejected):].decode() for k in marks), records)

    async def last(self) -> dict[str, Any] | None:
        kv = await self.etcd.get(self.last_key)
        return json.loads(kv.value) if kv is not None else None

    async def ask(self, request: RebalanceRequest, *, remove: tuple[str, ...] = (), add: tuple[str, ...] = ()) -> bool:
        """Store a new request unless one is in progress (a refused one is replaced): False then."""
        kv = await self.etcd.get(self.request_key)
        if kv is not None and RebalanceRequest.from_json(json.loads(kv.value)).refused is None:
            return False
        ops: list[Put | Delete] = [Put(self.request_key, _dumps(request.to_json()))]
        ops += [Put(self.ejected_key(n), b"{}") for n in remove]
        ops += [Delete(self.ejected_key(n)) for n in add]
        compare = Compare(self.request_key, "mod", kv.mod_revision if kv is not None else 0)
        return (await self.etcd.txn([compare], ops)).succeeded

    async def stop(self) -> RebalanceRequest | None:
        """Mark the request stopped (a refused one is deleted): its moves in flight wind down."""
        for _ in range(5):
            kv = await self.etcd.get(self.request_key)
            if kv is None:
                return None
            request = RebalanceRequest.from_json(json.loads(kv.value))
            compare = [Compare(self.request_key, "mod", kv.mod_revision)]
            if request.refused is not None:
                ops: list[Put | Delete] = [Delete(self.request_key)]
            else:
                request = replace(request, stopped=True)
                ops = [Put(self.request_key, _dumps(request.to_json()))]
            if (await self.etcd.txn(compare, ops)).succeeded:
                return request
        return None


def progress_of(request: RebalanceRequest, current: PartitionMap,
                progress: Mapping[tuple[int, str], ReplicaProgress]) -> dict[str, Any]:
    """Moved / remaining partitions and the items (seqnos) the new copies received so far."""
    if request.target is None or request.origin is None:
        return {"total": None, "moved": 0, "remaining": None, "transferred": 0}
    remaining = len(moves_left(current, request.target))
    transferred = 0
    for p, (want, before) in enumerate(zip(request.target, request.origin, strict=True)):
        for node in want.nodes:
            if not before.holds(node):
                reported = progress.get((p, node))
                if reported is not None:
                    transferred += reported.seqno
    return {"total": request.total, "moved": max(request.total - remaining, 0), "remaining": remaining,
            "transferred": transferred}


class RebalanceDriver:
    """The orchestrator's half: ``observe`` before its own step (which must leave the partitions
    in motion alone), ``carry_out`` after."""

    def __init__(self, etcd: EtcdClient, layout: Layout, maps: MapStore, guard: Callable[[], Compare], *,
                 max_parallel: int = 2, note: Note | None = None) -> None:
        self.store = RebalanceStore(etcd, layout)
        self.etcd, self.maps, self.guard, self.max_parallel = etcd, maps, guard, max_parallel
        #: the node's event log (the console's timeline): what an operator watches a rebalance by
        self.note: Note = note or (lambda message, **fields: None)
        #: set by the orchestrator's watch when a key under ``rebalance/`` or ``handover/`` changed
        self.dirty = True
        #: whether such a watch runs (set by the orchestrator); without one every cycle reads
        self.watched = False
        self._observed: Observed | None = None
        self._read_ahead = False

    async def read(self) -> None:
        """Read the rebalance's keys for the next ``observe``, if they may have changed: only
        when the orchestrator's watch saw one change (``dirty``) or this driver wrote one, so an
        idle cluster's cycles cost no read of them.  The orchestrator calls it beside its own
        reads, so a cycle costs one round of them rather than two in a row."""
        if self.dirty or not self.watched or self._observed is None:
            self.dirty = False  # before the read: a change made while it runs marks it again
            try:
                self._observed = await self.store.observe()
            except BaseException:
                # not read: marked again, or the change that asked for it would wait for the next
                # one, and nothing read ahead (the next cycle reads for itself)
                self.dirty, self._read_ahead = True, False
                raise
        self._read_ahead = True

    async def observe(self, view: ClusterView) -> tuple[RebalanceStep, Observed]:
        if not self._read_ahead:
            await self.read()
        self._read_ahead = False
        observed = self._observed
        assert observed is not None
        if observed.request is None and not observed.records:
            return RebalanceStep(based_on=view.map.revision), observed
        step = advance(RebalanceView(view.map, view.live_nodes, view.replicas, view.progress, observed.request,
                                     {p: s.handover for p, s in observed.records.items()}, self.max_parallel))
        return step, observed

    async def start_for_joined(self, view: ClusterView, observed: Observed) -> None:
        """``--cluster-auto-rebalance``: a node that joined holding nothing starts a rebalance."""
        if observed.request is not None or observed.records:
            return
        joined = unplaced_nodes(view.map, view.live_nodes, observed.ejected)
        if joined:
            self.dirty = True
        if joined and await self.store.ask(RebalanceRequest(eject=tuple(sorted(observed.ejected & view.map.nodes())),
                                                            id=f"auto-{view.map.revision}")):
            log.warning("auto-rebalance: node %s joined holding nothing; rebalancing", ", ".join(joined))

    async def carry_out(self, step: RebalanceStep, observed: Observed, view: ClusterView, map_mod_revision: int) -> None:
        request = observed.request
        if (step.store is not None or step.start or step.cancel or step.forget or step.new_map is not None
                or step.finished):
            self.dirty = True  # what this step writes is read back next cycle, not awaited from the watch
        guard = [Compare(self.store.request_key, "mod", observed.mod_revision), self.guard()]
        if step.store is not None:
            if (await self.etcd.txn(guard, [Put(self.store.request_key, _dumps(step.store.to_json()))])).succeeded:
                if step.store.refused is not None:
                    log.error("rebalance refused: %s", step.store.refused)
                elif step.store.waiting is not None:
                    log.warning("rebalance waiting: %s", step.store.waiting)
                elif step.store.planned and request is not None and not request.planned:
                    log.warning("rebalance planned at map revision %d: %d partition(s) to move%s", view.map.revision,
                                step.store.total, f", removing {', '.join(step.store.eject)}" if step.store.eject else "")
                    self.note(f"rebalance planned: {step.store.total} partition(s) to move", total=step.store.total,
                              eject=list(step.store.eject))
        for h in step.start:
            key = self.store.handovers.record_key(h.partition)
            created = await self.etcd.txn([Compare(key, "create", 0), *guard], [Put(key, _dumps(h.to_json()))])
            if created.succeeded:
                log.warning("rebalance: partition %d from node %s to node %s (in sync): stopping writes on %s",
                            h.partition, h.source, h.target, h.source)
                self.note(f"takeover of partition {h.partition} from {h.source} to {h.target} started",
                          partition=h.partition, node=h.target, source=h.source)
        for h, reason in step.cancel:
            if await self.store.handovers.update(observed.records[h.partition], None):
                log.warning("rebalance: takeover of partition %d from node %s called off (%s): it takes writes again",
                            h.partition, h.source, reason)
        for h in step.forget:
            await self.store.handovers.update(observed.records[h.partition], None)
        if step.new_map is not None:
            if await self.maps.publish(step.new_map, map_mod_revision, [self.guard()]):
                for h in step.switched:
                    log.warning("rebalance: partition %d is active on node %s from map revision %d (node %s gave out "
                                "up to seqno %s)", h.partition, h.target, step.new_map.revision, h.source, h.fenced_at)
                log.info("rebalance: published map revision %d (%d partition(s) changed)", step.new_map.revision,
                         len(step.new_map.changed_partitions(view.map)))
        if step.finished and request is not None:
            figures = progress_of(request, view.map, view.progress) if request.planned else {}
            result = "stopped" if request.stopped else "done"
            last = {"id": request.id, "result": result, **figures}
            done = await self.etcd.txn(guard, [Delete(self.store.request_key), Put(self.store.last_key, _dumps(last))])
            if done.succeeded:
                log.warning("rebalance %s: %s partition(s) moved, %s item(s) transferred", result,
                            figures.get("moved", 0), figures.get("transferred", 0))
                self.note(f"rebalance {result}: {figures.get('moved', 0)} partition(s) moved, "
                          f"{figures.get('transferred', 0)} item(s) transferred", **last)


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
