"""Where partition copies should live: every copy on a distinct node, load spread evenly, and as
few copies moved as possible.

Two modes, because moving a copy costs a full stream of the partition and moving an active
costs a takeover:

* ``rebalance=False`` (what the orchestrator does on its own after a node joins, leaves or
  dies): copies on nodes that are gone are dropped, extra replicas are trimmed and missing
  replicas are added on the least loaded nodes.  No active moves and no healthy replica moves.
  A gone node named in ``keep`` (gone for less than the replace grace) keeps its replica slots:
  a node that restarts comes back to the copies it holds and only streams what it missed, as a
  Kafka broker keeps its replica assignments while it is down and Couchbase keeps a failed
  node's vBuckets until it is failed over.  Its slots are not filled elsewhere and no new copy
  is put on it until it is live again.
* ``rebalance=True`` (the operator's rebalance): actives and replicas are also moved until
  every node holds its share, within one.  An active moves preferably to a node that already
  holds a replica of the partition, so the takeover streams only the last items.

A partition with no active is never given one here unless ``create`` is set (the cluster is
new and every partition is empty): after a failure, choosing a new active is promotion's
decision (``engine.cluster.promotion``), because an empty new active would silently lose the
partition's history.

Deterministic: the same inputs give the same map on every node, so a map can be checked by
recomputing it.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.cluster.partition_map import Placement


def place(
    current: Sequence[Placement],
    nodes: Iterable[str],
    replicas: int,
    *,
    rebalance: bool = False,
    create: bool = False,
    keep: Iterable[str] = (),
) -> tuple[Placement, ...]:
    """The placements that should follow ``current`` given the live ``nodes``.

    ``replicas`` is the replica count the cluster was created with; fewer are placed while the
    cluster has fewer nodes than copies (a kept node counts: it is expected back).  ``keep``:
    gone nodes whose replica slots stay where they are.
    """
    live = sorted(set(nodes))
    kept = sorted(set(keep) - set(live))
    if replicas < 0:
        raise ValueError("replicas must be >= 0")
    plan = _Plan(current, live, kept)
    if create:
        plan.assign_homeless_actives()
    if rebalance:
        plan.spread_actives()
    want = min(replicas, max(len(live) + len(kept) - 1, 0))
    plan.trim_replicas(want)
    plan.fill_replicas(want)
    if rebalance:
        plan.spread_replicas()
    return plan.placements()


class _Plan:
    """Mutable working copy of the placements, with per-node counts kept up to date."""

    def __init__(self, current: Sequence[Placement], live: list[str], kept: Sequence[str] = ()) -> None:
        alive = set(live)
        slotted = alive | set(kept)
        self.live = live
        self.alive = alive
        #: nodes whose replica copies count: the live ones and the gone ones whose slots are kept
        self.holders = sorted(slotted)
        self.active: list[str | None] = [p.active if p.active in alive else None for p in current]
        self.replicas: list[list[str]] = [[r for r in p.replicas if r in slotted] for p in current]

    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(a, tuple(r)) for a, r in zip(self.active, self.replicas, strict=True))

    # ------------------------------------------------------------------ counts
    def _actives(self) -> dict[str, int]:
        counts = dict.fromkeys(self.live, 0)
        for node in self.active:
            if node is not None:
                counts[node] += 1
        return counts

    def _replica_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(self.holders, 0)
        for held in self.replicas:
            for node in held:
                counts[node] += 1
        return counts

    def _holds(self, partition: int, node: str) -> bool:
        return self.active[partition] == node or node in self.replicas[partition]

    @staticmethod
    def _quotas(counts: dict[str, int], total: int) -> dict[str, int]:
        """Each node's fair share of ``total``; the remainder goes to the nodes holding most now,
        so that as few copies as possible move."""
        if not counts:
            return {}
        base, extra = divmod(total, len(counts))
        ranked = sorted(counts, key=lambda n: (-counts[n], n))
        return {node: base + (1 if i < extra else 0) for i, node in enumerate(ranked)}

    # ------------------------------------------------------------------ actives
    def assign_homeless_actives(self) -> None:
        counts = self._actives()
        for p, node in enumerate(self.active):
            if node is None and self.live:
                chosen = min(self.live, key=lambda n: (counts[n], n))
                self.active[p] = chosen
                counts[chosen] += 1
                if chosen in self.replicas[p]:
                    self.replicas[p].remove(chosen)

    def spread_actives(self) -> None:
        counts = self._actives()
        quota = self._quotas(counts, sum(counts.values()))
        for prefer_replica in (True, False):
            for p, donor in enumerate(self.active):
                if donor is None or counts[donor] <= quota[donor]:
                    continue
                receivers = [n for n in self.live if counts[n] < quota[n] and n != donor]
                if prefer_replica:
                    receivers = [n for n in receivers if n in self.replicas[p]]
                if not receivers:
                    continue
                receiver = min(receivers, key=lambda n: (counts[n], n))
                # The old active keeps its copy as a replica: its data is already there.
                held = [r for r in self.replicas[p] if r != receiver]
                self.replicas[p] = [donor, *held]
                self.active[p] = receiver
                counts[donor] -= 1
                counts[receiver] += 1

    # ------------------------------------------------------------------ replicas
    def trim_replicas(self, want: int) -> None:
        counts = self._replica_counts()
        for p, held in enumerate(self.replicas):
            while len(held) > want:
                # a gone node's slot goes first: the live copies are the ones serving
                drop = max(held, key=lambda n: (n not in self.alive, counts[n], n))
                held.remove(drop)
                counts[drop] -= 1

    def fill_replicas(self, want: int) -> None:
        replica_counts = self._replica_counts()
        active_counts = self._actives()
        for p, held in enumerate(self.replicas):
            if self.active[p] is None:
                continue
            while len(held) < want:
                candidates = [n for n in self.live if not self._holds(p, n)]
                if not candidates:
                    break
                chosen = min(candidates, key=lambda n: (replica_counts[n] + active_counts[n], replica_counts[n], n))
                held.append(chosen)
                replica_counts[chosen] += 1

    def spread_replicas(self) -> None:
        counts = self._replica_counts()
        quota = self._quotas(counts, sum(counts.values()))
        moved = True
        while moved:
            moved = False
            for p, held in enumerate(self.replicas):
                for donor in list(held):
                    if donor not in self.alive or counts[donor] <= quota[donor]:
                        continue
                    receivers = [n for n in self.live if counts[n] < quota[n] and not self._holds(p, n)]
                    if not receivers:
                        continue
                    receiver = min(receivers, key=lambda n: (counts[n], n))
                    held[held.index(donor)] = receiver
                    counts[donor] -= 1
                    counts[receiver] += 1
                    moved = True
