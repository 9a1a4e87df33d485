"""When to wake the tailing streams: at once on an idle loop, a few writes at a time on a busy one.

Theory of operation
-------------------
Every delivery of changed partitions (``app.stream.hub``) wakes each subscribed connection, and
each woken connection runs a pass and sends at least one WebSocket message.  With many consumers
tailing a steady trickle of writes, nearly every write is its own pass on every connection: the
loop's work grows with writes × consumers, messages carry one item each, and once the loop is
saturated every wake-up queues behind the others (the fan-out lag in docs/benchmarks.md, Peers).

``WakePacer`` makes the number of passes follow the load instead.  Two rules, both only when at
least ``min_subscribers`` connections wait for changes (the per-write cost grows with them; a lone
tailing consumer is never paced):

* **Spacing**: deliveries to the streams are at least ``spacing(subscribers)`` apart
  (``spacing_per_subscriber_s`` per subscriber, at most ``max_spacing_s``).  A change arriving
  sooner after the last delivery is held until that spacing has passed, with any that arrive
  meanwhile, so each connection's pass carries every write of that interval in one message.
  WHY in proportion to the subscribers: a delivery costs the loop a pass per subscriber, so the
  spacing bounds the share of the loop the wake-ups take (and the messages each consumer must
  read) whatever the write rate, while a change after a quiet spell (a lone write, a slow
  trickle) goes out at once.  The added delay is at most the spacing.
* **Busy loop**: the hub tells it how long its delivery callback waited in the loop's queue
  (``CoalescedPartitions.delay``: from the first change of the burst to the callback running).  A
  wait of ``busy_after_s`` or more means the loop already has a queue: the changes are gathered for
  ``gather_s`` more.

Only the wake-up is deferred, never what a stream may send: a visit still reads the partition's
state when it begins, and barrier cookies draw a visit of every stream themselves, so order,
snapshots and barriers are as without pacing.  Replication streams are neither paced nor counted
here: the hub wakes them at once (``ChangeHub.set_prompt``).  Pure logic (the caller passes the
loop's clock; no loop): the hub owns the timer.
"""
from __future__ import annotations

__all__ = ["WakePacer"]


class WakePacer:
    def __init__(self, busy_after_s: float = 0.001, gather_s: float = 0.002, min_subscribers: int = 8,
                 spacing_per_subscriber_s: float = 0.0001, max_spacing_s: float = 0.005) -> None:
        if busy_after_s < 0 or gather_s < 0 or spacing_per_subscriber_s < 0 or max_spacing_s < 0:
            raise ValueError("busy_after_s, gather_s and the spacings must not be negative")
        self.busy_after_s = busy_after_s
        self.min_subscribers = min_subscribers
        #: 0 turns pacing off: every delivery goes out at once
        self.gather_s = gather_s
        self.spacing_per_subscriber_s = spacing_per_subscriber_s
        self.max_spacing_s = max_spacing_s
        self._held: set[int] = set()
        #: when the held changes are due (the caller's clock; None: ``gather_s`` after holding)
        self.release_at: float | None = None
        self._last_delivery = float("-inf")
        self.held_deliveries = 0  # deliveries gathered instead of delivered at once (for benchmarks)

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def spacing(self, subscribers: int) -> float:
        """The least time between two deliveries to ``subscribers`` paced connections."""
        if self.gather_s <= 0 or subscribers < self.min_subscribers:
            return 0.0
        return min(self.max_spacing_s, subscribers * self.spacing_per_subscriber_s)

    def offer(self, changed: frozenset[int], waited_s: float, subscribers: int,
              now: float | None = None) -> frozenset[int] | None:
        """Changes whose delivery callback waited ``waited_s`` in the loop's queue, for
        ``subscribers`` connections, at ``now`` (the caller's clock; None: no spacing rule): the
        partitions to deliver now, or None when they are held (the caller then makes sure
        ``release`` is called at ``release_at``, or ``gather_s`` after holding when that is None)."""
        if self._held:
            self._held |= changed
            self.held_deliveries += 1
            return None
        if self.gather_s <= 0 or subscribers < self.min_subscribers or not changed:
            if changed and now is not None:
                self._last_delivery = now
            return changed
        busy = waited_s >= self.busy_after_s
        spaced_at = self._last_delivery + self.spacing(subscribers) if now is not None else None
        soon = spaced_at is not None and now is not None and now < spaced_at
        if not busy and not soon:
            if now is not None:
                self._last_delivery = now
            return changed
        self._held = set(changed)
        self.held_deliveries += 1
        if now is None:
            self.release_at = None
        else:
            due = now + self.gather_s if busy else now
            self.release_at = max(due, spaced_at) if spaced_at is not None else due
        return None

    def release(self, now: float | None = None) -> frozenset[int]:
        """The held partitions, all at once (empty if none)."""
        out, self._held = frozenset(self._held), set()
        self.release_at = None
        if out and now is not None:
            self._last_delivery = now
        return out
