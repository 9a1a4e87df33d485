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
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.cluster.etcd import Compare, Delete, EtcdClient, EtcdError, Get, Put, WatchEvent
from app.cluster.etcd_thread import EtcdThread
from app.cluster.layout import Layout
from app.cluster.mapstore import MapStore
from app.cluster.switch_trace import SwitchTrace, traced
from engine.cluster.handover import Handover, HandoverRequest, HandoverView, advance, switch_by_source, takes_over
from engine.cluster.orchestration import ClusterView
from engine.cluster.partition_map import PartitionMap
from engine.cluster.rebalance import REBALANCE
from engine.core.errors import PartitionNotActive
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
        #: set by the orchestrator's watch when a key under ``handover/`` changed
        self.dirty = True
        #: whether such a watch runs (set by the orchestrator); without one every cycle reads
        self.watched = False
        self._read: tuple[dict[str, HandoverRequest], dict[int, Stored]] | None = None
        self._read_ahead = False

    async def read(self) -> None:
        """Read the requests and records for the next ``cycle``, if they may have changed: only
        when the orchestrator's watch saw a change under ``handover/`` (or this driver wrote
        there), so an idle cluster's cycles cost no read.  The orchestrator calls it beside its
        own reads."""
        if self.dirty or not self.watched or self._read is None:
            self.dirty = False  # before the reads: a change made while they run marks it again
            try:
                self._read = await asyncio.gather(self.store.requests(), self.store.records())
            except BaseException:
                # not read: marked again, or the change that asked for it would wait for the next
                # one, and nothing read ahead (the next cycle reads for itself)
                self.dirty, self._read_ahead = True, False
                raise
        self._read_ahead = True

    async def cycle(self, view: ClusterView, map_mod_revision: int) -> None:
        if not self._read_ahead:
            await self.read()
        self._read_ahead = False
        assert self._read is not None
        requests, records = self._read
        # a rebalance's takeover records are the rebalance driver's to advance
        stored = {p: s for p, s in records.items() if s.handover.kind != REBALANCE}
        if not requests and not stored:
            return
        self.dirty = True  # something is in motion: what this cycle writes is read back next time
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
    """A node's half: stop writes where it is a source, take over where it is a target.

    A source fences each partition on a task of its own (``_fence``), off the node's map
    following, in three waits, each woken by the event it waits for rather than polled:

    1. **catch-up**: writes go on until the target's stream has acknowledged all but
       ``catch_up_items`` of the partition (Couchbase's takeover streams until the replica is
       nearly caught up before it sets the vbucket dead), or ``catch_up_wait_s`` passed, so the
       pause is not spent streaming a backlog a busy target built up; then, for at most
       ``settle_wait_s``, until it is within ``settle_items`` (none by default: the moment the
       target has acknowledged everything, between two writes), so the fence usually finds the
       target's acknowledgement already there and waits for no stream round trip, which on a
       busy pair of nodes is the longest step of the pause; writes go on while it settles, so
       settling costs the pause nothing;
    2. **fence**: ``Engine.stop_writes``, then the target's acknowledgement of the fenced seqno
       (up to ``ack_wait_s``), recorded with ``fenced_at`` and, the map allowing, the switched map
       in one write; an acknowledgement that comes later is added in a second write, with the
       switch again when the map allows it (else the orchestrator switches on the record);
    3. **the pause**: a write refused meanwhile waits (``until_settled``) until the map names
       the target, then is answered with a 421 naming it, which clients follow without reading
       the map.  When the source published the switch itself it knows at once (``on_switched``
       hands the map to the node before the watch brings it back); on the target, a write that
       arrives once the record is fenced but before ``take_over`` has run waits for it
       (``until_active``) instead of being refused, so the 421 is never bounced back.

    Each fence logs how long its steps took (catch-up, stop, acknowledgement, the etcd write),
    beside the seqnos: writes are refused from the end of the stop on, so the pause is the last
    two plus the client's hop to the target.

    ``records`` mirrors the records in etcd as of ``revision``: a full read (``load``) and the
    node's watch events (``apply_event``) both feed it, and neither replaces newer knowledge with
    older, so a map taken from a watch event is never followed with records older than it.
    """

    def __init__(self, etcd: EtcdClient, layout: Layout, engine: Engine, node: str, *,
                 acked: Callable[[str, int], int | None] | None = None,
                 on_ack: Callable[[Callable[[int], None]], Callable[[], None]] | None = None,
                 ack_wait_s: float = 0.5, late_ack_wait_s: float = 10.0, catch_up_items: int = 256,
                 catch_up_wait_s: float = 10.0, max_parked: int = 1024,
                 on_switched: Callable[[bytes, int], None] | None = None, settle_items: int = 0,
                 settle_wait_s: float = 0.2) -> None:
        self.store = HandoverStore(etcd, layout)
        self.maps = MapStore(etcd, layout)
        self.engine, self.node = engine, node
        self.records: dict[int, Stored] = {}
        #: the etcd revision ``records`` is as of (a full read's, or the last event applied)
        self.revision = 0
        #: (replica node, partition) -> what that replica's stream acknowledged holding, if known
        self.acked = acked
        self.ack_wait_s, self.late_ack_wait_s = ack_wait_s, late_ack_wait_s
        self.catch_up_items, self.catch_up_wait_s = catch_up_items, catch_up_wait_s
        self.settle_items, self.settle_wait_s = settle_items, settle_wait_s
        self.max_parked = max_parked
        #: told the raw map and its etcd mod revision when this node published a switch itself
        #: (the node follows it at once instead of one watch round trip later)
        self.on_switched = on_switched
        #: partition -> set when this node, a handover's target, became active for it (or the
        #: record went): writes waiting there (``until_active``) go ahead
        self._active_now: dict[int, asyncio.Event] = {}
        #: the record deletions of takeovers done, under way (``taken_over_soon``)
        self._deleting: set[asyncio.Task[None]] = set()
        #: partition -> set when an acknowledgement of it may have moved (``on_ack``'s listener)
        self._ack_moved: dict[int, asyncio.Event] = {}
        self._unsubscribe = on_ack(self._on_ack) if on_ack is not None else None
        #: partition -> its fence task (at most one)
        self._fencing: dict[int, asyncio.Task[None]] = {}
        #: partition -> set when its pause ends (the map moved it, or writes resumed)
        self._pause_over: dict[int, asyncio.Event] = {}
        self._parked = 0
        self._current: PartitionMap | None = None
        #: the newest map a watch event carried, and its etcd mod revision
        self._map_kv: tuple[bytes, int] | None = None
        #: partition -> the target of the switch this node, its source, has sent to etcd and not
        #: yet seen answered: writes refused here go on to that target now (``switching_to``)
        self._switching: dict[int, str] = {}
        #: stamps of each switch transaction for a benchmark (``app.cluster.switch_trace``), or None
        self.switch_trace: SwitchTrace | None = None
        #: the switch transaction's own connection, on a thread: it waits for no event-loop turn
        self.switch_etcd = EtcdThread(etcd)

    async def load(self) -> None:
        kvs, revision = await self.store.etcd.get_prefix(self.store._partitions)
        if revision < self.revision:
            return  # the watch already brought newer records than this read saw
        records = {}
        for kv in kvs:
            handover = Handover.from_json(json.loads(kv.value))
            records[handover.partition] = Stored(handover, kv.mod_revision)
        self.records, self.revision = records, revision
        self._release()

    async def as_new_as(self, revision: int) -> None:
        """Make ``records`` at least as new as etcd revision ``revision`` (the map's mod revision):
        read them again if the last read or event is older.  The node reads the map and the
        records at once, so the records' read may run before a transaction that wrote a fence
        and the switched map together (``_switch``); following that map with the older records
        would promote the target (a new failover entry) instead of taking over."""
        if self.revision < revision:
            await self.load()

    def apply_event(self, event: WatchEvent) -> bool:
        """A watch event of the cluster's prefix: True if it was a handover record's (applied)."""
        key = event.kv.key
        prefix = self.store._partitions
        if key == self.maps.layout.map and event.kind == "put":
            self._map_kv = (event.kv.value, event.kv.mod_revision)  # the newest map, for ``_switch``
            return False
        if not key.startswith(prefix) or event.kv.mod_revision <= self.revision:
            return False
        partition = int(key[len(prefix):])
        if event.kind == "delete":
            self.records.pop(partition, None)
            self._release()
            self.became_active(partition)
        else:
            stored = Stored(Handover.from_json(json.loads(event.kv.value)), event.kv.mod_revision)
            self.records[partition] = stored
            # a new record naming this node its source: the fence starts now, not after the
            # node's next full read of the cluster
            self._maybe_fence(stored)
        self.revision = event.kv.mod_revision
        moved = self._ack_moved.get(partition)
        if moved is not None:
            moved.set()  # a fence task waiting for catch-up re-checks that its record still stands
        return True

    def map_seen(self, new: PartitionMap) -> None:
        """A newer map reached the node (a watch event, or this node's own switch), before the
        node has followed it: writes held at a switched partition go on to its new active now,
        not after the engine's states were changed."""
        if self._current is not None and new.revision > self._current.revision:
            self._current = new
            self._release()

    def takes_over(self, partition: int) -> bool:
        """Whether this node's copy of ``partition``, which the map now makes active, is a
        handover's target holding everything its source gave out (then ``take_over``)."""
        stored = self.records.get(partition)
        _high, mark = self.engine.replica_mark(partition)
        return takes_over(stored.handover if stored else None, self.node, mark.complete_end)

    def taken_over_soon(self, partition: int) -> None:
        """``taken_over`` on a task of its own: the node follows the rest of the map meanwhile
        rather than holding its lock across the etcd write."""
        self.became_active(partition)
        stored = self.records.pop(partition, None)
        if stored is None:
            return
        task = asyncio.create_task(self._delete_quietly(stored), name=f"handover record {partition}: delete")
        self._deleting.add(task)
        task.add_done_callback(self._deleting.discard)

    async def _delete_quietly(self, stored: Stored) -> None:
        partition = stored.handover.partition
        try:
            await self.store.update(stored, None)
        except EtcdError as exc:
            # the record stays: the next ``follow`` sees the partition active here and deletes it
            log.warning("node %s: deleting partition %d's handover record failed: %s", self.node, partition, exc)

    async def taken_over(self, partition: int) -> None:
        """This node, the target, took ``partition`` over: writes waiting for it go ahead now,
        then the record is deleted (which tells the orchestrator the handover is done)."""
        self.became_active(partition)
        stored = self.records.pop(partition, None)
        if stored is not None:
            await self.store.update(stored, None)

    async def follow(self, current: PartitionMap) -> None:
        """Start fencing where a record makes this node a source; take writes again where a
        paused partition has no record any more and the map still names this node active (the
        handover was called off); delete the records of takeovers done; release the writes
        waiting on pauses that ended."""
        engine = self.engine
        self._current = current
        for p, stored in sorted(self.records.items()):
            h = stored.handover
            if h.target == self.node and current.active_of(p) == self.node and engine.state(p) is PartitionState.ACTIVE:
                await self.taken_over(p)  # taken over earlier, but deleting the record failed then
                continue
            self._maybe_fence(stored)
        for p in range(engine.num_partitions):
            stored = self.records.get(p)
            if (engine.writes_stopped(p) and current.active_of(p) == self.node and p not in self._fencing
                    and (stored is None or stored.handover.source != self.node)):
                await asyncio.to_thread(engine.resume_writes, p)
                log.warning("node %s: partition %d takes writes again (its handover was called off)", self.node, p)
        self._release()

    def _maybe_fence(self, stored: Stored) -> None:
        """Start the fence task of a record that makes this node a source, if not started yet."""
        h, current = stored.handover, self._current
        p = h.partition
        if (h.source != self.node or h.fenced_at is not None or current is None or current.active_of(p) != self.node
                or self.engine.state(p) is not PartitionState.ACTIVE or p in self._fencing):
            return
        # the switch's connection opens during the catch-up, not inside the write pause
        self.switch_etcd.warm()
        task = asyncio.create_task(self._fence(p, stored), name=f"fence partition {p}")
        self._fencing[p] = task
        task.add_done_callback(lambda _t: self._fencing.pop(p, None))

    async def fenced(self) -> None:
        """Wait for the fence tasks started so far (tests, shutdown)."""
        await asyncio.gather(*list(self._fencing.values()), return_exceptions=True)

    async def aclose(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        for task in list(self._fencing.values()):
            task.cancel()
        await self.fenced()
        await asyncio.gather(*list(self._deleting), return_exceptions=True)
        self.switch_etcd.close()

    # ------------------------------------------------------------------ writes during the pause
    def in_handover(self, partition: int) -> bool:
        """Whether this node is the source of ``partition``'s handover in flight (its record
        is still there: the target deletes it once it has taken over)."""
        stored = self.records.get(partition)
        return stored is not None and stored.handover.source == self.node

    async def until_settled(self, partition: int, timeout_s: float) -> bool:
        """A write to ``partition`` was refused here during its handover (paused, or the map
        just moved it): wait until the pause is over, at most ``timeout_s``; True if it is.
        Over: the map names another node active (the switch: the write goes on there, where
        ``until_active`` holds it until the takeover has run), or the handover was called off
        and this node takes writes again.  At most ``max_parked`` writes wait at once; the
        others get their answer at once."""
        if not self.in_handover(partition) or self._parked >= self.max_parked:
            return False
        if self._pause_ended(partition):
            return True
        event = self._pause_over.setdefault(partition, asyncio.Event())
        self._parked += 1
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._parked -= 1

    def switching_to(self, partition: int) -> str | None:
        """The node a write refused here for ``partition`` should go to before the map says so:
        the target of the switch this node has sent and etcd has not answered yet.  WHY: the
        answer reaches a busy source's loop tens of milliseconds after the target, watching the
        map, took over (docs/benchmarks.md, Cluster: "Switch announced"); the target holds such
        a write until its takeover (``until_active``), so sending it there early costs nothing
        and takes that wait out of the pause.  Writes stay stopped here whatever etcd answers."""
        return self._switching.get(partition)

    def _pause_ended(self, partition: int) -> bool:
        current = self._current
        if not self.in_handover(partition) or partition in self._switching:
            return True
        return current is not None and (current.active_of(partition) != self.node
                                        or not self.engine.writes_stopped(partition))

    def _release(self) -> None:
        for p, event in list(self._pause_over.items()):
            if self._pause_ended(p):
                event.set()
                del self._pause_over[p]

    # ------------------------------------------------------------------ writes at the target
    def taking_over(self, partition: int) -> bool:
        """Whether this node is the target of ``partition``'s handover in flight while the copy
        here is not active yet: a write that arrives now was sent here by the source, whose
        switch is about to make it this node's."""
        stored = self.records.get(partition)
        # fenced or not: the source sends writes here as soon as it has sent the switch, which
        # records the fence in the same transaction, so a write may arrive before this node has
        # seen that transaction (it is held, never applied, until the takeover or ``timeout_s``)
        return (stored is not None and stored.handover.target == self.node
                and self.engine.state(partition) is not PartitionState.ACTIVE)

    async def until_active(self, partition: int, timeout_s: float) -> bool:
        """A write for ``partition`` reached this node, the target, between the fence and its
        ``take_over``: wait for the takeover (at most ``timeout_s``, and only while the record
        stands) rather than refuse it, so a client sent here by the source's 421 is served
        here, not sent back.  True if the partition is active here now."""
        if self.taking_over(partition) and self._parked < self.max_parked:
            event = self._active_now.setdefault(partition, asyncio.Event())
            self._parked += 1
            try:
                async with asyncio.timeout(timeout_s):
                    await event.wait()
            except asyncio.TimeoutError:
                pass
            finally:
                self._parked -= 1
        return self.engine.state(partition) is PartitionState.ACTIVE

    def became_active(self, partition: int) -> None:
        """``partition`` is active here now (taken over, or its record went): release the writes
        ``until_active`` holds for it."""
        event = self._active_now.pop(partition, None)
        if event is not None:
            event.set()

    # ------------------------------------------------------------------ the source's fence
    async def _switch(self, stored: Stored, fenced: Handover, stamps: _Stamps | None = None) -> str | None:
        """Record the fence and publish the switched map in one transaction, guarded by the map's
        and the record's etcd revisions (``switch_by_source``); None when the map does not allow
        it or the record changed meanwhile: the fence is then recorded alone and the orchestrator
        switches (or calls the handover off).  Once it is written the switch is the truth: the
        node follows that map at once (``on_switched``) and the writes held by the pause are
        answered with a 421 naming the target, with no wait for the watch to bring the map
        back.  Returns the map revision published.

        WHY the retries: every partition's switch writes the one map key, and a rebalance's
        sources switch side by side, so a transaction is often refused only because another
        source's switch moved the map first.  The refusal reads the record and the map back in
        the same round trip, and the switch is tried again on that map (``SWITCH_TRIES``), where
        handing it to the orchestrator would keep the writes paused for its next cycle.

        WHY its own connection on a thread (``EtcdThread``): the transaction is in the write
        pause, and on the source's busy event loop each of a request's steps waits for a turn
        of the loop (docs/benchmarks.md, Cluster: "The switch transaction off the event loop")."""
        # the newest map the watch brought saves a read
        seen = self._map_kv
        if seen is not None:
            current, mod_revision = PartitionMap.from_json(json.loads(seen[0])), seen[1]
        else:
            current, mod_revision = await self.maps.load(self.engine.num_partitions)
        p = fenced.partition
        key = self.store.record_key(p)
        for _ in range(SWITCH_TRIES):
            new = switch_by_source(current, fenced, self.node)
            if new is None:
                return None
            raw = _dumps(new.to_json())
            # the writes held by the pause go to the target while etcd commits (``switching_to``)
            self._switching[p] = fenced.target
            self._release()
            compare = [Compare(key, "mod", stored.mod_revision), Compare(self.maps.layout.map, "mod", mod_revision)]
            success = [Put(key, _dumps(fenced.to_json())), Put(self.maps.layout.map, raw)]
            failure = [Get(key), Get(self.maps.layout.map)]
            try:
                done, stamped = await traced(self.switch_trace, lambda stamps: self.switch_etcd.txn(
                    compare, success, failure, marks=stamps))
            finally:
                self._switching.pop(p, None)
            if stamped is not None:
                log.warning("node %s: partition %d: switch trace (%s): %s", self.node, p,
                            "committed" if done.succeeded else "refused", stamped)
            if done.succeeded:
                self._map_kv = (raw, done.revision)
                if self._current is None or new.revision > self._current.revision:
                    self._current = new
                if self.on_switched is not None:
                    self.on_switched(raw, done.revision)
                self._release()
                return f"is active there from map revision {new.revision} (switched by its source)"
            if stamps is not None:
                stamps.mark("switch refused")
            record, maps = done.reads if len(done.reads) == 2 else ((), ())
            if not record or record[0].mod_revision != stored.mod_revision or not maps:
                return None
            current, mod_revision = PartitionMap.from_json(json.loads(maps[0].value)), maps[0].mod_revision
        return None

    def _on_ack(self, partition: int) -> None:
        event = self._ack_moved.get(partition)
        if event is not None:
            event.set()

    def _still(self, stored: Stored) -> bool:
        """The record is as it was when fencing started, and the map still names this node."""
        now = self.records.get(stored.handover.partition)
        current = self._current
        return (now is not None and now.mod_revision == stored.mod_revision and current is not None
                and current.active_of(stored.handover.partition) == self.node)

    async def _until(self, partition: int, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``done()``, re-checked on each acknowledgement (or record change) of
        ``partition``, at most ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        event = self._ack_moved.setdefault(partition, asyncio.Event())
        while not done():
            left = deadline - loop.time()
            if left <= 0:
                return False
            event.clear()
            if done():
                return True
            try:
                async with asyncio.timeout(left):
                    await event.wait()
            except asyncio.TimeoutError:
                return done()
        return True

    def _target_ack(self, h: Handover) -> int | None:
        return self.acked(h.target, h.partition) if self.acked is not None else None

    async def _fence(self, p: int, stored: Stored) -> None:
        h = stored.handover
        engine = self.engine
        stamps = _Stamps()
        try:
            if self.acked is not None:
                def within(items: int) -> Callable[[], bool]:
                    def caught_up() -> bool:
                        got = self._target_ack(h)
                        # no acknowledgement on this connection yet (an idle copy acks only what
                        # it applies): nothing says it lags, so no reason to hold the fence back
                        return not self._still(stored) or got is None or engine.high_seqno(p) - got <= items
                    return caught_up
                if await self._until(p, within(self.catch_up_items), self.catch_up_wait_s):
                    # writes go on meanwhile: this wait costs no pause, and shortens it
                    await self._until(p, within(self.settle_items), self.settle_wait_s)
                else:
                    got = self._target_ack(h)
                    log.warning("node %s: partition %d: target node %s still %s behind after %.0f s; fencing anyway",
                                self.node, p, h.target,
                                f"{engine.high_seqno(p) - got} item(s)" if got is not None else "unacknowledged",
                                self.catch_up_wait_s)
            stamps.mark("catch-up")
            if not self._still(stored) or engine.state(p) is not PartitionState.ACTIVE:
                return
            try:
                seqno = await _stop_writes(engine, p)
            except PartitionNotActive:
                return
            stamps.mark("stop")
            behind = self._behind(h, seqno)
            # the target streams from here: wait for it to acknowledge the last items, so the
            # record says so and the switch need not wait for its progress report
            def acknowledged() -> bool:
                got = self._target_ack(h)
                return got is not None and got >= seqno
            acked = self.acked is not None and await self._until(p, acknowledged, self.ack_wait_s)
            stamps.mark(f"ack of {behind} item(s)" if behind is not None else "ack")
            fenced = h.fenced(seqno, self._target_ack(h) if acked else None)
            switched = await self._switch(stored, fenced, stamps) if acked else None
            if switched is not None:
                stamps.mark("switch")
                log.warning("node %s: partition %d stopped taking writes at seqno %d and, acknowledged by node %s, %s; "
                            "%s", self.node, p, seqno, h.target, switched, stamps)
                return
            if not await self.store.update(stored, fenced):
                await asyncio.to_thread(engine.resume_writes, p)  # called off meanwhile
                self._pause_over.pop(p, asyncio.Event()).set()
                return
            stamps.mark("record")
            log.warning("node %s: partition %d stopped taking writes at seqno %d for its handover to node %s%s; %s",
                        self.node, p, seqno, h.target, " (acknowledged by it)" if acked else "", stamps)
            if acked or self.acked is None:
                return
            # not acknowledged in time: add it once it comes, so the switch need not wait for
            # the target's progress report (published every few hundred ms)
            kv = await self.store.etcd.get(self.store.record_key(p))
            if kv is None:
                return
            later = Stored(Handover.from_json(json.loads(kv.value)), kv.mod_revision)
            if later.handover != fenced:
                return
            if await self._until(p, acknowledged, self.late_ack_wait_s):
                # switched here too when the map allows it: the orchestrator would only do the same
                # after its watch wake-up and a cycle, with the writes still paused
                late = fenced.fenced(seqno, self._target_ack(h))
                switched = await self._switch(later, late)
                if switched is not None:
                    log.warning("node %s: partition %d, acknowledged late by node %s, %s", self.node, p, h.target,
                                switched)
                else:
                    await self.store.update(later, late)
        except EtcdError as exc:
            # the record stays as it was: the next map following starts a new fence task, and a
            # partition paused without a record saying so takes writes again there
            log.warning("node %s: fencing partition %d for its handover failed: %s", self.node, p, exc)

    def _behind(self, h: Handover, seqno: int) -> int | None:
        got = self._target_ack(h)
        return max(seqno - got, 0) if got is not None else None


#: transactions a source tries for its switch when each is refused only because the map moved
#: (another source's switch went first)
SWITCH_TRIES = 4


#: how long the source tries to stop a partition's writes on its event loop (the writer lock is
#: held by a write for a millisecond or so at a time) before it waits for the lock on a thread
STOP_ON_LOOP_S = 0.01


async def _stop_writes(engine: Engine, partition: int) -> int:
    """``Engine.stop_writes`` on the event loop while the writer lock is free at the moment, a
    few tries apart, else on a thread.  WHY: the stop is the first step of the write pause and
    costs no I/O, while a thread hop on a busy node costs tens of milliseconds (docs/benchmarks.md,
    Cluster: "Flush rounds that hand over the LMDB turn")."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_ON_LOOP_S
    while True:
        seqno = engine.stop_writes(partition, wait=False)
        if seqno is not None:
            return seqno
        if loop.time() >= deadline:
            break
        await asyncio.sleep(0.001)
    seqno = await asyncio.to_thread(engine.stop_writes, partition)
    assert seqno is not None
    return seqno


class _Stamps:
    """Milliseconds between the steps of one fence, for its log line: where a pause went."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._steps: list[str] = []

    def mark(self, step: str) -> None:
        now = time.monotonic()
        self._steps.append(f"{step} {(now - self._last) * 1000:.0f} ms")
        self._last = now

    def __str__(self) -> str:
        return ", ".join(self._steps)


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
