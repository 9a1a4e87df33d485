"""Durable writes on the active: one node-wide ``DurabilityTracker`` fed by the replicas' acks, the
map and the writes waiting on them.

Three inputs, each a thin hook:

* **acks**: every replication connection's ``ServerSession`` keeps the latest ``seqno_ack`` per
  partition; the stream adapter hands the session over after each message it receives on such
  a connection (``acked``) and says when the connection ends (``closed``);
* **the map** (``follow_map``, from ``ClusterNode``): which partitions this node is active for
  and which replicas count for each, per the current revision;
* **writes**: ``wait`` parks a write (its partition and seqno) until a majority of the copies
  hold it, or its timeout passes.

Which connection speaks for a copy: the one that most recently opened a stream of the
partition.  A replica reconnects after a rollback or a map change, and its older connection may
still deliver a message or two; those figures predate a possible reset, so once a newer
connection claims a partition the older one is never heard for it again.  A connection that ends
takes its figures with it: until the copy acks on its next stream it holds nothing we count.

Every call runs on the event loop; nothing here blocks.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from app.problems import Problem, ProblemType
from engine.cluster.durability import DurabilityTracker, Waiter, majority_of
from engine.cluster.partition_map import PartitionMap
from engine.cluster.replica_acks import ReplicaAck
from engine.engine import Engine
from engine.protocol.session import REPLICATION_PREFIX, ServerSession

__all__ = ["DURABILITY_AMBIGUOUS", "DURABILITY_IMPOSSIBLE", "DurabilityAmbiguous", "DurabilityImpossible",
           "DurableWrites", "majority_wait"]

#: WHY 504 (gateway timeout): the write was accepted and applied on the active, which then waited
#: for other nodes that did not answer in time; the outcome is unknown, not refused
DURABILITY_AMBIGUOUS = ProblemType("durability-ambiguous", 504, "Durability ambiguous: the write may have been applied")
#: WHY 503: too few copies are live to ever form a majority; nothing was written, retry after a failover
DURABILITY_IMPOSSIBLE = ProblemType("durability-impossible", 503, "Durability impossible: the write was not applied")


class DurabilityAmbiguous(Exception):
    """A durable write did not reach its level in time: it *may* have been applied (it sits in the
    active's history and may reach its replicas later, or be taken back by a failover)."""

    def __init__(self, partition: int, seqno: int, node: str, level: str, reason: str) -> None:
        super().__init__(f"partition {partition} seqno {seqno} on node {node}: not {level}-durable ({reason}); "
                         "the write may have been applied")
        self.partition, self.seqno, self.node, self.level, self.reason = partition, seqno, node, level, reason


class DurabilityImpossible(Exception):
    """Too few live copies of the partition to form a majority: refused before anything is written."""

    def __init__(self, partition: int, node: str, live: int, copies: int) -> None:
        super().__init__(f"partition {partition} on node {node}: only {live} of its {copies} copies are live, "
                         f"a majority needs {majority_of(copies)}; the write was not applied")
        self.partition, self.node, self.live, self.copies = partition, node, live, copies


def problem_of(exc: DurabilityAmbiguous | DurabilityImpossible) -> Problem:
    """The problem document: what happened to the write, and where (partition, seqno, node)."""
    if isinstance(exc, DurabilityImpossible):
        return Problem(DURABILITY_IMPOSSIBLE, str(exc), partition=exc.partition, headers={"Retry-After": "1"},
                       extra={"node": exc.node, "applied": False, "live_copies": exc.live, "copies": exc.copies})
    return Problem(DURABILITY_AMBIGUOUS, str(exc), partition=exc.partition,
                   extra={"seqno": exc.seqno, "node": exc.node, "durability": exc.level, "applied": "unknown",
                          "reason": exc.reason})


async def majority_wait(durable: DurableWrites | None, targets: Mapping[int, int], persist: bool,
                        timeout_s: float) -> None:
    """``DurableWrites.wait`` for a route, its outcomes as problem documents; no cluster (one
    copy): nothing to wait for beyond the active's own memory or persist."""
    if durable is None or not targets:
        return
    try:
        await durable.wait(targets, persist, timeout_s)
    except DurabilityAmbiguous as exc:
        durable.count_failure("ambiguous", exc.level)
        raise problem_of(exc) from None


def check_possible(durable: DurableWrites | None, partition: int, level: str = "majority") -> None:
    """``DurableWrites.check_possible`` for a route (503 ``durability-impossible``), counted
    under ``level``."""
    if durable is None:
        return
    try:
        durable.check_possible(partition)
    except DurabilityImpossible as exc:
        durable.count_failure("impossible", level)
        raise problem_of(exc) from None


class DurableWrites:
    """The active's durable-write waiting, for every partition this node is active for."""

    def __init__(self, engine: Engine, node: str, is_live: Callable[[str], bool] = lambda node: True) -> None:
        self.engine, self.node, self.is_live = engine, node, is_live
        self.tracker = DurabilityTracker()
        self._active: frozenset[int] = frozenset()
        self._copies: dict[int, tuple[str, ...]] = {}  # partition -> replicas in the map (this node active)
        self._waiting: dict[int, tuple[Waiter, asyncio.Future[None]]] = {}
        #: (replica node, partition) -> the connection that speaks for that copy
        self._owner: dict[tuple[str, int], object] = {}
        #: connection -> partitions it claimed (each once: a superseded connection never reclaims)
        self._claimed: dict[object, set[int]] = {}
        #: connection -> partition -> the last ``seqno_ack`` taken from it (each message object once)
        self._seen: dict[object, dict[int, object]] = {}
        #: (outcome, level) -> durable writes answered ``ambiguous`` or ``impossible`` (``GET /metrics``)
        self.failures: dict[tuple[str, str], int] = {}
        #: told the partitions whose ``majority_seqno`` may have moved (an ack moved, a new map):
        #: the stream server's ``visibility: majority`` ceilings wake on it
        self.on_advance: Callable[[int], None] | None = None
        #: further listeners of the same moments (``add_advance_listener``): a handover waiting
        #: for its target's acknowledgement wakes on the ack itself rather than polling
        self._advance_listeners: list[Callable[[int], None]] = []

    # ------------------------------------------------------------------ the map
    def follow_map(self, pmap: PartitionMap) -> None:
        """The current map: which partitions are ours and whose copies count."""
        active = set()
        for p, placement in enumerate(pmap.placements):
            if placement.active == self.node:
                active.add(p)
                self._copies[p] = tuple(placement.replicas)
                self.tracker.set_replicas(p, frozenset(placement.replicas))
            else:
                self._copies.pop(p, None)
        self._active = frozenset(active)
        self._give_up(lambda w: w.partition not in self._active, "this node is no longer active for the partition")
        self._settle()
        self._advanced(sorted(self._active))

    def retire_all(self, reason: str) -> None:
        """Fenced: nothing of ours counts any more; every waiter is ambiguous now."""
        self._active = frozenset()
        self._copies.clear()
        self._give_up(lambda w: True, reason)

    def check_possible(self, partition: int) -> None:
        """Raise ``DurabilityImpossible`` when too few of ``partition``'s copies are live to form a
        majority (Couchbase's DurabilityImpossible): a write that could only end ambiguous is
        refused before it is applied.  Partitions not ours are left to the write's own routing."""
        replicas = self._copies.get(partition)
        if replicas is None:
            return
        copies = 1 + len(replicas)
        live = 1 + sum(1 for r in replicas if self.is_live(r))
        if live < majority_of(copies):
            raise DurabilityImpossible(partition, self.node, live, copies)

    def impossible(self) -> dict[int, DurabilityImpossible]:
        """Each partition this node is active for whose live copies cannot form a majority now,
        with its refusal: a bulk batch, whose partitions are known only once parsed, is checked
        against it before anything is written."""
        out = {}
        for p in self._copies:
            try:
                self.check_possible(p)
            except DurabilityImpossible as exc:
                out[p] = exc
        return out

    def count_failure(self, outcome: str, level: str) -> None:
        """A durable write was answered ``outcome`` (``ambiguous``, ``impossible``) at ``level``."""
        key = (outcome, level)
        self.failures[key] = self.failures.get(key, 0) + 1

    def add_advance_listener(self, listener: Callable[[int], None]) -> Callable[[], None]:
        """Call ``listener(partition)`` whenever ``on_advance`` is told, beside it; returns the
        function that removes it again."""
        self._advance_listeners.append(listener)

        def remove() -> None:
            if listener in self._advance_listeners:
                self._advance_listeners.remove(listener)
        return remove

    def _advanced(self, partitions: list[int]) -> None:
        hook, listeners = self.on_advance, tuple(self._advance_listeners)
        if hook is None and not listeners:
            return
        for p in partitions:
            if hook is not None:
                hook(p)
            for listener in listeners:
                listener(p)

    # ------------------------------------------------------------------ acks (stream adapter hook)
    def acked(self, conn: object, session: ServerSession) -> None:
        """After a message on a stream connection: take the figures of a replication connection."""
        hello = session.hello
        if hello is None or not hello.name.startswith(REPLICATION_PREFIX):
            return
        node = hello.name[len(REPLICATION_PREFIX):]
        claimed = self._claimed.setdefault(conn, set())
        acks = self.tracker.acks
        if not claimed.issuperset(session.positions):
            for p in session.positions:
                if p not in claimed:
                    claimed.add(p)
                    self._owner[(node, p)] = conn
                    acks.stream_started(node, p)
        # WHY only the acks not seen yet: this runs after every message of the connection, and a
        # replica acks each of its partitions on its own, so rereading them all made each ack
        # cost as many steps as the connection has partitions
        seen = self._seen.setdefault(conn, {})
        moved = []
        for p, ack in session.replica_acks.items():
            if seen.get(p) is ack:
                continue
            seen[p] = ack
            if self._owner.get((node, p)) is conn:
                before = acks.get(node, p)
                if acks.acknowledged(node, p, ack.received, ack.persisted) != before:
                    moved.append(p)
        if moved:
            self._settle(moved)
            self._advanced(moved)

    def closed(self, conn: object, session: ServerSession) -> None:
        """A stream connection ended: the copies it spoke for are unknown until they ack again."""
        claimed = self._claimed.pop(conn, set())
        self._seen.pop(conn, None)
        hello = session.hello
        if hello is None or not hello.name.startswith(REPLICATION_PREFIX):
            return
        node = hello.name[len(REPLICATION_PREFIX):]
        for p in claimed:
            if self._owner.get((node, p)) is conn:
                del self._owner[(node, p)]
                self.tracker.acks.forget_stream(node, p)

    # ------------------------------------------------------------------ writes
    async def wait(self, targets: Mapping[int, int], persist: bool, timeout_s: float) -> None:
        """Return once a majority of each partition's copies hold its target seqno (persisted if
        ``persist``: the caller has waited for the active's own persist first, since Couchbase's
        persistToMajority counts the active only once it persisted); raise ``DurabilityAmbiguous``
        after ``timeout_s``, when the node stops being active for a partition, or at once when too
        few of a partition's copies are live to form a majority (a bulk batch, whose partitions
        are known only once written)."""
        level = "persist_majority" if persist else "majority"
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s
        parked: list[tuple[Waiter, asyncio.Future[None]]] = []
        for p, seqno in sorted(targets.items()):  # every check before anything is parked
            if p not in self._active:
                raise DurabilityAmbiguous(p, seqno, self.node, level, "this node is not active for the partition")
            try:
                self.check_possible(p)
            except DurabilityImpossible as exc:  # written already: no longer "not applied", but no use waiting
                raise DurabilityAmbiguous(p, seqno, self.node, level,
                                          f"only {exc.live} of its {exc.copies} copies are live") from None
        if not targets:
            return
        for p, seqno in sorted(targets.items()):
            self._own_progress(p)
            waiter = self.tracker.wait(p, seqno, persist, deadline)
            future: asyncio.Future[None] = loop.create_future()
            self._waiting[waiter.token] = (waiter, future)
            parked.append((waiter, future))
        self._settle()
        try:
            done, pending = await asyncio.wait([f for _, f in parked], timeout=timeout_s,
                                               return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            self._cancel(parked)
            raise
        self._cancel(parked)
        # every failed future's exception is taken, not only the first: a fence fails all of a
        # batch's waiters at once, and asyncio logs each one left unretrieved as an error
        failed = [exc for _, future in parked if future.done() and (exc := future.exception()) is not None]
        if failed:
            raise failed[0]
        for waiter, future in parked:
            if not future.done():
                copies = 1 + len(self.tracker.replicas_of(waiter.partition))
                held = self.tracker.copies_holding(waiter.partition, waiter.seqno, persist)
                raise DurabilityAmbiguous(waiter.partition, waiter.seqno, self.node, level,
                                          f"{held} of {copies} copies hold it after {timeout_s * 1000:.0f} ms, "
                                          f"a majority needs {majority_of(copies)}")

    def majority_seqno(self, partition: int, persisted: bool) -> int:
        """The highest seqno of ``partition`` a majority of its current copies hold (see
        ``DurabilityTracker.majority_seqno``), with this node's own progress read now.  Called
        from stream reader threads too, so it only reads."""
        engine = self.engine
        own = engine.persisted_seqno(partition) if persisted else engine.high_seqno(partition)
        return self.tracker.majority_seqno(partition, persisted, own=own)

    def replica_ack(self, node: str, partition: int) -> ReplicaAck | None:
        return self.tracker.acks.get(node, partition)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # ------------------------------------------------------------------ internals
    def _own_progress(self, partition: int) -> None:
        engine = self.engine
        self.tracker.active_progress(partition, engine.high_seqno(partition), engine.persisted_seqno(partition))

    def _settle(self, partitions: list[int] | None = None) -> None:
        if not self._waiting:
            return
        for waiter in self.tracker.satisfied(partitions):
            entry = self._waiting.pop(waiter.token, None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(None)

    def _give_up(self, which: Callable[[Waiter], bool], reason: str) -> None:
        for token, (waiter, future) in list(self._waiting.items()):
            if which(waiter):
                del self._waiting[token]
                self.tracker.cancel(token)
                if not future.done():
                    level = "persist_majority" if waiter.persist else "majority"
                    future.set_exception(DurabilityAmbiguous(waiter.partition, waiter.seqno, self.node, level, reason))

    def _cancel(self, parked: list[tuple[Waiter, Any]]) -> None:
        for waiter, _future in parked:
            self._waiting.pop(waiter.token, None)
            self.tracker.cancel(waiter.token)
