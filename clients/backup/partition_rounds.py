"""When one partition's restore may be called done: a pure decision fed with what its writes met.

Theory of operation.  A partition's batches go at ``memory`` (acknowledged once the active holds
them: the fast path for the bulk of the data) and its last batch at a durable level whose wait
covers every earlier batch:

* on a single node, ``persist``: the node flushes its history in seqno order, so the last
  batch on disk means every earlier one is too;
* in a cluster, ``persist_majority``: replicas copy the active's history in seqno order and
  acknowledge the ends of whole snapshots, so a majority of copies holding the last batch on disk
  holds every earlier batch on disk too.  WHY not ``majority`` then ``persist``: the journal
  records the partition as done for good (a resumed restore skips it), so the claim must outlive
  any one node *and* a restart of every node; ``persist_majority`` is the one level that does,
  and it costs one wait per partition, overlapped by the parallel partitions.

Both hold only while every batch of the round was acknowledged by the same active on the same
history.  When the active may have changed in between (the map named another node, an item came
back 421/503, the node stopped answering, a request met a 5xx), or the partition's history
branched (the newest failover-log entry read before the first batch differs from the one read
after the last: a promotion or a crash restart, even one the client never saw), batches
acknowledged only in the old active's memory may be gone, and the final wait on the new active does not cover them: the
partition is written again from its first batch (restore writes are idempotent), at most
``max_rounds`` times.  A final batch answered 504 ``durability-ambiguous`` or 503
``durability-impossible`` by an undisturbed active is sent again (its earlier batches are still
in that active's history), at most ``max_final_retries`` times; then the partition fails with a
message naming it, its seqno and the node.  Nothing here reports success after a doubt.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MEMORY", "Done", "Fail", "PartitionRounds", "Route", "Send", "Step", "final_durability"]

MEMORY = "memory"


def final_durability(cluster: bool) -> str:
    """The level of a partition's last batch (see the module docstring for why)."""
    return "persist_majority" if cluster else "persist"


@dataclass(frozen=True, slots=True)
class Route:
    """Who acknowledged a write: the node's URL and how many times the partition's active was
    seen to change before the write was sent (the targets' epoch for it)."""

    url: str
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Send:
    """Send batch ``batch`` at ``durability``; ``delay_s`` first (a retried final batch)."""

    batch: int
    durability: str
    round: int
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Done:
    rounds: int


@dataclass(frozen=True, slots=True)
class Fail:
    message: str
    seqno: int | None = None


Step = Send | Done | Fail


class PartitionRounds:
    """One partition's restore: which batch to send next, at which level, and when it is done.

    Fed with ``acked`` (a batch's items were acknowledged; ``disturbed``: its write met a sign of a
    move on the way) and ``refused`` (the final batch's durable wait answered 504/503)."""

    def __init__(self, partition: int, batches: int, *, cluster: bool, max_rounds: int = 4,
                 max_final_retries: int = 6, retry_delay_s: float = 0.5, max_delay_s: float = 4.0) -> None:
        if batches < 1:
            raise ValueError("a partition's restore has at least one batch")
        self.partition, self.batches, self.cluster = partition, batches, cluster
        self.max_rounds, self.max_final_retries = max_rounds, max_final_retries
        self.retry_delay_s, self.max_delay_s = retry_delay_s, max_delay_s
        self.round = 1
        self.redo_reasons: list[str] = []
        self._route: Route | None = None  # who acknowledged this round's first batch
        self._branch: int | None = None  # the partition's newest failover-log uuid before the first batch
        self._final_retries = 0

    @property
    def final(self) -> str:
        return final_durability(self.cluster)

    def start(self) -> Step:
        return self._send(0)

    def _send(self, batch: int, delay_s: float = 0.0) -> Send:
        level = self.final if batch == self.batches - 1 else MEMORY
        return Send(batch, level, self.round, delay_s)

    def branch_before(self, branch: int | None) -> None:
        """The partition's newest failover-log uuid on its active, read before the round's first
        batch is sent (None: it could not be read)."""
        self._branch = branch

    def acked(self, batch: int, route: Route, *, disturbed: bool = False, seqno: int | None = None,
              branch: int | None = None) -> Step:
        """Every item of ``batch`` (its last seqno ``seqno``) was acknowledged by ``route`` at the
        level it was sent with; for the last batch, ``branch`` is the partition's newest
        failover-log uuid read after that acknowledgement."""
        if batch == 0:
            self._route = route  # nothing of this round was acknowledged before: nothing to lose
        elif disturbed or route != self._route:
            return self._redo(self._why(route, disturbed), route, seqno)
        if batch == self.batches - 1:
            if self.batches > 1 and (branch is None or branch != self._branch):
                why = (f"its history on {route.url} branched (failover log {self._branch} -> {branch})"
                       if branch is not None and self._branch is not None
                       else f"its history on {route.url} could not be read to rule out a branch")
                return self._redo(why, route, seqno)
            return Done(self.round)
        return self._send(batch + 1)

    def refused(self, route: Route, detail: str, *, disturbed: bool = False, seqno: int | None = None) -> Step:
        """The final batch's durable wait did not succeed (504 ambiguous, 503 impossible)."""
        if self.batches > 1 and (disturbed or route != self._route):
            return self._redo(self._why(route, disturbed), route, seqno)
        self._final_retries += 1
        if self._final_retries > self.max_final_retries:
            return Fail(f"partition {self.partition}, seqno {seqno}, node {route.url}: the last batch was not "
                        f"{self.final}-durable after {self._final_retries} attempts ({detail}); the restore is "
                        "not complete, run it again once the cluster has a majority of copies", seqno)
        if self.batches == 1:
            self._route = route
        delay = min(self.retry_delay_s * 2 ** (self._final_retries - 1), self.max_delay_s)
        return self._send(self.batches - 1, delay)

    def _why(self, route: Route, disturbed: bool) -> str:
        assert self._route is not None
        if route.url != self._route.url:
            return f"its active moved from {self._route.url} to {route.url}"
        if route.epoch != self._route.epoch:
            return f"the map named another active for it (on {route.url} again)"
        return f"a write to {route.url} met a lost node or a moved partition" if disturbed else "unknown"

    def _redo(self, why: str, route: Route, seqno: int | None) -> Step:
        self.redo_reasons.append(why)
        if self.round >= self.max_rounds:
            return Fail(f"partition {self.partition}, seqno {seqno}, node {route.url}: written {self.round} times "
                        f"and its active changed during each ({why}); the restore is not complete, run it "
                        "again once the cluster is stable", seqno)
        self.round += 1
        self._route = None
        self._final_retries = 0
        return self._send(0)
