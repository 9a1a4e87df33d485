"""When a write is held by a majority of its partition's copies: the waiting behind durable writes.

A ``majority`` write is acknowledged once a majority of the partition's copies (the active plus
the replicas of the current map) hold it in memory; a ``persist_majority`` write once a majority
have persisted it (Couchbase's durability levels).  A majority survives any minority of node
losses, so a failover that promotes the most advanced in-sync replica keeps every such write.

Only replicas of the current map count: a node that streams the partition but left the map
cannot be promoted, so its copy protects nothing.  With no replicas the majority of one copy is
the active itself, so ``majority`` means ``memory`` and ``persist_majority`` means ``persist``.

A waiter whose deadline passes is returned by ``expired`` and forgotten: its write *may* have
been applied (it sits in the active's history), so the caller answers "ambiguous", never "failed".

Pure: fed with the active's own progress, replica acks and the clock; an async adapter parks
writers on the tokens it returns.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import count

from engine.cluster.replica_acks import ReplicaAcks

__all__ = ["DurabilityTracker", "Waiter", "majority_of"]


def majority_of(copies: int) -> int:
    """How many of ``copies`` make a majority."""
    return copies // 2 + 1


@dataclass(frozen=True, slots=True)
class Waiter:
    """A write waiting for ``seqno`` of ``partition`` to reach a majority (persisted if ``persist``)."""

    token: int
    partition: int
    seqno: int
    persist: bool
    deadline: float


@dataclass(slots=True)
class _Active:
    received: int = 0
    persisted: int = 0
    replicas: frozenset[str] = field(default_factory=frozenset)


class DurabilityTracker:
    """The copies of each partition this node is active for, and the writes waiting on them."""

    def __init__(self, acks: ReplicaAcks | None = None) -> None:
        self.acks = acks if acks is not None else ReplicaAcks()
        self._partitions: dict[int, _Active] = {}
        self._waiters: dict[int, Waiter] = {}
        #: the same waiters by partition: an ack of one partition looks at that partition's only
        self._by_partition: dict[int, dict[int, Waiter]] = {}
        self._tokens = count(1)

    def _active(self, partition: int) -> _Active:
        return self._partitions.setdefault(partition, _Active())

    def set_replicas(self, partition: int, replicas: frozenset[str]) -> None:
        """The current map names ``replicas`` for ``partition`` (a new map changes the majority)."""
        self._active(partition).replicas = frozenset(replicas)

    def active_progress(self, partition: int, received: int, persisted: int) -> None:
        """The active's own high seqno and persisted seqno of ``partition``."""
        active = self._active(partition)
        active.received = max(active.received, received)
        active.persisted = max(active.persisted, persisted)

    def copies_holding(self, partition: int, seqno: int, persist: bool) -> int:
        """How many copies of ``partition`` hold ``seqno`` (persisted if ``persist``)."""
        active = self._active(partition)
        held = int((active.persisted if persist else active.received) >= seqno)
        for node in active.replicas:
            ack = self.acks.get(node, partition)
            if ack is not None and (ack.persisted if persist else ack.received) >= seqno:
                held += 1
        return held

    def is_durable(self, partition: int, seqno: int, persist: bool) -> bool:
        """Whether a majority of the current copies of ``partition`` hold ``seqno``."""
        copies = 1 + len(self._active(partition).replicas)
        return self.copies_holding(partition, seqno, persist) >= majority_of(copies)

    def majority_seqno(self, partition: int, persisted: bool, own: int | None = None) -> int:
        """The highest seqno of ``partition`` held (persisted if ``persisted``) by a majority of its
        current copies: what no failover can take back, the bound of ``visibility: majority``.

        The copies' figures sorted from the highest: the majority's weakest member is the
        ``majority_of(copies)``-th; a replica that never acked counts as holding nothing.
        ``own``: the active's own figure read now (else the last one fed in).  A pure read,
        safe beside the loop's updates: stream readers ask it from their threads."""
        active = self._partitions.get(partition) or _Active()
        if own is None:
            own = active.persisted if persisted else active.received
        held = [own]
        for node in active.replicas:
            ack = self.acks.get(node, partition)
            held.append(0 if ack is None else ack.persisted if persisted else ack.received)
        held.sort(reverse=True)
        return held[majority_of(len(held)) - 1]

    def replicas_of(self, partition: int) -> frozenset[str]:
        """The replicas of ``partition`` that count, as the current map names them."""
        return self._active(partition).replicas

    def wait(self, partition: int, seqno: int, persist: bool, deadline: float) -> Waiter:
        """Register a write; ``satisfied`` returns it once it is durable (it may be already)."""
        waiter = Waiter(next(self._tokens), partition, seqno, persist, deadline)
        self._waiters[waiter.token] = waiter
        self._by_partition.setdefault(partition, {})[waiter.token] = waiter
        return waiter

    def cancel(self, token: int) -> None:
        """The writer went away: stop tracking it."""
        waiter = self._waiters.pop(token, None)
        if waiter is not None:
            self._forget(waiter)

    def _forget(self, waiter: Waiter) -> None:
        of_partition = self._by_partition[waiter.partition]
        del of_partition[waiter.token]
        if not of_partition:
            del self._by_partition[waiter.partition]

    def satisfied(self, partitions: Iterable[int] | None = None) -> list[Waiter]:
        """Waiters whose write reached its majority, removed from the tracker; only those of
        ``partitions`` when given (what an ack of them can have changed).  Each partition's
        majority seqnos are computed once, not once per waiter."""
        done = []
        for p in list(self._by_partition) if partitions is None else partitions:
            waiters = self._by_partition.get(p)
            if not waiters:
                continue
            held = self.majority_seqno(p, False), self.majority_seqno(p, True)
            done += [w for w in waiters.values() if w.seqno <= held[w.persist]]
        for waiter in done:
            del self._waiters[waiter.token]
            self._forget(waiter)
        return done

    def expired(self, now: float) -> list[Waiter]:
        """Waiters past their deadline and not durable: their writes are ambiguous."""
        late = [
            w for w in self._waiters.values()
            if now >= w.deadline and not self.is_durable(w.partition, w.seqno, w.persist)
        ]
        for waiter in late:
            del self._waiters[waiter.token]
            self._forget(waiter)
        return late

    @property
    def waiting(self) -> int:
        return len(self._waiters)
