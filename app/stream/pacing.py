"""When to wake the tailing streams: at once on an idle loop, a few writes at a time on a busy one.

Theory of operation
-------------------
Every delivery of changed partitions (``app.stream.hub``) wakes each subscribed connection, and
each woken connection runs a pass and sends at least one WebSocket message.  With many consumers
tailing a steady trickle of writes, nearly every write is its own pass on every connection: the
loop's work grows with writes × consumers, messages carry one item each, and once the loop is
saturated every wake-up queues behind the others (the fan-out lag in docs/benchmarks.md, Peers).

``WakePacer`` makes the number of passes follow the loop's spare time instead.  The hub tells it
how long its delivery callback waited in the loop's queue (``CoalescedPartitions.delay``: from the
first change of the burst to the callback running).  A short wait means the loop is idle: the
changes are delivered at once, so a lone write is never held.  A wait of ``busy_after_s`` or more
means the loop already has a queue, and if at least ``min_subscribers`` connections wait for
changes (the per-write cost grows with them; a lone tailing consumer is never paced) the changes
are gathered for ``gather_s`` (with any that
arrive meanwhile) and delivered together, so each connection's pass carries several writes in one
message.  The added delay is bounded by ``gather_s``, and it only happens when the loop's own
queueing is at least ``busy_after_s`` already.

Only the wake-up is deferred, never what a stream may send: a visit still reads the partition's
state when it begins, and barrier cookies draw a visit of every stream themselves, so order,
snapshots and barriers are as without pacing.  Replication streams are neither paced nor counted
here: the hub wakes them at once (``ChangeHub.set_prompt``).  Pure logic (no clock, no loop): the hub owns the
timer.
"""
from __future__ import annotations

__all__ = ["WakePacer"]


class WakePacer:
    def __init__(self, busy_after_s: float = 0.001, gather_s: float = 0.002, min_subscribers: int = 8) -> None:
        if busy_after_s < 0 or gather_s < 0:
            raise ValueError("busy_after_s and gather_s must not be negative")
        self.busy_after_s = busy_after_s
        self.min_subscribers = min_subscribers
        #: 0 turns pacing off: every delivery goes out at once
        self.gather_s = gather_s
        self._held: set[int] = set()
        self.held_deliveries = 0  # deliveries gathered instead of delivered at once (for benchmarks)

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def offer(self, changed: frozenset[int], waited_s: float, subscribers: int) -> frozenset[int] | None:
        """Changes whose delivery callback waited ``waited_s`` in the loop's queue, for
        ``subscribers`` connections: the partitions to deliver now, or None when they are held (the caller then makes sure ``release`` is
        called ``gather_s`` after the first held delivery)."""
        if self._held:
            self._held |= changed
            self.held_deliveries += 1
            return None
        if (self.gather_s > 0 and waited_s >= self.busy_after_s and subscribers >= self.min_subscribers
                and changed):
            self._held = set(changed)
            self.held_deliveries += 1
            return None
        return changed

    def release(self) -> frozenset[int]:
        """The held partitions, all at once (empty if none)."""
        out, self._held = frozenset(self._held), set()
        return out
