"""What a node may assume about its own lease, from its keep-alives alone.

A node serves writes for its partitions only while it may still hold its lease: once the lease
expires the orchestrator may promote other copies, and two nodes would take writes for one
partition.  The node cannot ask etcd at every write, so it keeps a local **deadline**: the
send time of its last keep-alive that etcd answered, plus the TTL etcd granted.  etcd starts the
TTL when the keep-alive arrives, later than it was sent, so the lease lives at least that long.

Past the deadline without a renewal there are two very different cases, and the node must tell
them apart on its own:

* **it was not running** (SIGSTOP, a VM pause, a starved process): the deadline fires late, or
  on time with no keep-alive tried since the last renewal.  The lease has most likely expired
  and its partitions may already have a new active (Patroni's "primary that kept committing
  after losing its lock").  Verdict ``STALLED``: the node stops taking writes at once, before it
  reads any request that waited in its sockets, and waits for etcd's answer to its next
  keep-alive (alive: serve again; gone: rejoin).
* **etcd is away** (down, restarting, unreachable): the node was running and trying, and a
  keep-alive failed or is still waiting.  No orchestrator can change the map while etcd is
  away, and an etcd leader that starts (a restart, a new election) extends every lease, so the
  lease may well still be valid.  Verdict ``ETCD_AWAY``: keep serving what it owns (Patroni's
  lesson: an etcd blip must not demote healthy actives), say so once.

Pure and clock-agnostic (the caller passes its monotonic time); tested with tables in
tests/cluster/test_lease_clock.py.
"""
from __future__ import annotations

import enum

__all__ = ["LeaseClock", "LeaseVerdict"]


class LeaseVerdict(enum.StrEnum):
    HOLDS = "holds"
    STALLED = "stalled"
    ETCD_AWAY = "etcd_away"


class LeaseClock:
    """The local deadline of one lease and what the keep-alives saw since it was last renewed.

    ``stall_slack_s``: how late the deadline may be noticed and still count as on time (event
    loop jitter under load); a node noticed later than that was not running.
    """

    def __init__(self, stall_slack_s: float) -> None:
        self.stall_slack_s = stall_slack_s
        self.deadline: float | None = None
        #: send time of the keep-alive waiting for its answer, if any
        self.waiting_since: float | None = None
        #: a keep-alive failed to reach etcd since the last renewal
        self.failed = False

    def renewed(self, sent_at: float, ttl_s: float) -> None:
        """etcd answered a keep-alive (or a grant) sent at ``sent_at``: the lease has ``ttl_s`` left."""
        self.deadline = sent_at + ttl_s
        self.waiting_since = None
        self.failed = False

    def attempt(self, sent_at: float) -> None:
        """A keep-alive was sent at ``sent_at``."""
        self.waiting_since = sent_at

    def unreachable(self) -> None:
        """The keep-alive did not reach etcd (refused, reset, timed out)."""
        self.waiting_since = None
        self.failed = True

    def verdict(self, now: float) -> LeaseVerdict:
        if self.deadline is None or now < self.deadline:
            return LeaseVerdict.HOLDS
        if now - self.deadline > self.stall_slack_s:
            return LeaseVerdict.STALLED
        if self.failed or self.waiting_since is not None:
            return LeaseVerdict.ETCD_AWAY
        return LeaseVerdict.STALLED
