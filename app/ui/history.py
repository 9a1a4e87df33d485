"""Recent figures for the console's small charts (pure, stdlib only).

WHY on the server: a page opened now shows the last minutes at once, and five open pages cost
one sample per second, not five.  Counters are turned into rates here (a restart of a counter,
e.g. a stream that closed, counts as no progress rather than a negative rate).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    #: wall-clock seconds (epoch)
    time: float
    mutations_per_s: float
    deliveries_per_s: float
    flushes_per_s: float
    queue_bytes: float


class RateHistory:
    """The last ``capacity`` samples, one per ``add``."""

    def __init__(self, capacity: int = 300) -> None:
        self._samples: deque[Sample] = deque(maxlen=capacity)
        self._prev: tuple[float, float, float, float] | None = None  # monotonic, writes, deliveries, flushes

    def add(self, *, wall: float, monotonic: float, writes: float, delivered: float, flushes: float,
            queue_bytes: float) -> Sample | None:
        """``writes``, ``flushes``: totals so far; ``delivered``: seqnos delivered since the previous
        call.  The first call only sets the baseline (returns None)."""
        prev, self._prev = self._prev, (monotonic, writes, delivered, flushes)
        if prev is None or monotonic <= prev[0]:
            return None
        dt = monotonic - prev[0]
        sample = Sample(wall, max(0.0, writes - prev[1]) / dt, max(0.0, delivered) / dt,
                        max(0.0, flushes - prev[3]) / dt, queue_bytes)
        self._samples.append(sample)
        return sample

    def series(self) -> dict[str, list[float]]:
        samples = list(self._samples)
        return {
            "time": [round(s.time, 3) for s in samples],
            "mutations_per_s": [round(s.mutations_per_s, 1) for s in samples],
            "deliveries_per_s": [round(s.deliveries_per_s, 1) for s in samples],
            "flushes_per_s": [round(s.flushes_per_s, 2) for s in samples],
            "queue_bytes": [s.queue_bytes for s in samples],
        }


class DeliveryCounter:
    """Seqnos delivered since the last call, from each open stream's last sent seqno per partition.

    Streams come and go between calls: a new (stream, partition) pair counts from where it was
    first seen, a gone one stops counting, so neither shows as a burst."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, int], int] = {}

    def delta(self, positions: dict[tuple[int, int], int]) -> int:
        total = 0
        for key, seqno in positions.items():
            before = self._last.get(key)
            if before is not None and seqno > before:
                total += seqno - before
        self._last = dict(positions)
        return total
