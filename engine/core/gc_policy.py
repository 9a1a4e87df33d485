"""When the cyclic garbage collector runs: short young collections, full ones on a clock.

Theory of operation
-------------------
CPython's collector is generational: a generation-0 collection examines the objects allocated
since the last one (``young`` of them), a generation-1 collection the survivors of the last
``middle`` generation-0 collections, a full collection every tracked object.  Each holds the
GIL, so its pause is a stall of the event loop, the writer thread and every stream at once, and
a pause is proportional to the objects it examines (docs/benchmarks.md, Peers: tail GC pauses).

A server's objects are either short-lived (a request, a frame: freed by reference counting
before any collection sees them) or long-lived (queued items, cached stream readings, the
modules); almost nothing makes reference cycles.  So:

* ``young`` small: a generation-0 pause stays around a millisecond.  Raising it does not save
  work (every survivor is examined once, however often collections run), it only makes each
  pause longer;
* ``middle`` small: a generation-1 collection examines at most ``young * middle`` survivors;
* no automatic full collection: CPython would run one whenever the long-lived heap grew by a
  quarter, each a pause proportional to the whole heap (every queued item, every cached
  reading).  ``FullCollectionClock`` arms one at most every ``full_interval_s`` instead, which
  bounds how long cyclic garbage among long-lived objects waits to be freed.  Armed, the next
  collection due is a full one, still subject to CPython's own rule that it be worth it (the
  survivors since the last one are at least a quarter of the heap it left).

This module decides thresholds from collections observed; ``engine.gc_tuning`` applies them.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NEVER", "FullCollectionClock", "GcPolicy"]

#: A generation-2 threshold no count of generation-1 collections reaches.
NEVER = 2**31 - 1


@dataclass(frozen=True, slots=True)
class GcPolicy:
    """Thresholds of the cyclic GC (see the module docstring for why these values)."""

    young: int = 2_000
    middle: int = 2
    #: Seconds between full collections at most (None: CPython's own rule, every 10 generation-1
    #: collections once the heap grew by a quarter).
    full_interval_s: float | None = 120.0

    def __post_init__(self) -> None:
        if self.young < 1 or self.middle < 1:
            raise ValueError("GC thresholds must be at least 1")
        if self.full_interval_s is not None and self.full_interval_s <= 0:
            raise ValueError("full_interval_s must be positive (or None)")


class FullCollectionClock:
    """Fed every finished collection (generation, monotonic seconds); says which thresholds to set.

    Between full collections the generation-2 threshold is ``NEVER``; once ``full_interval_s``
    has passed since the last full collection (or since start) it is 0, so the next collection
    that CPython finds worth it is a full one; after it, ``NEVER`` again."""

    def __init__(self, policy: GcPolicy, now: float) -> None:
        self.policy = policy
        self.last_full = now
        self.armed = False

    def thresholds(self) -> tuple[int, int, int]:
        p = self.policy
        if p.full_interval_s is None:
            return p.young, p.middle, 10
        return p.young, p.middle, 0 if self.armed else NEVER

    def collected(self, generation: int, now: float) -> tuple[int, int, int] | None:
        """The thresholds to set after a collection of ``generation``, or None to keep them."""
        if self.policy.full_interval_s is None:
            return None
        if generation >= 2:
            self.last_full = now
            if self.armed:
                self.armed = False
                return self.thresholds()
            return None
        if not self.armed and now - self.last_full >= self.policy.full_interval_s:
            self.armed = True
            return self.thresholds()
        return None
