"""Capped exponential backoff with jitter for reconnects.

Jitter spreads the reconnects of many consumers after a server restart (a fixed 200 ms retry, as in
java-dcp-client, makes them arrive together; JDCP-124 had to throttle them).  Pure: the random source
is injectable so tests are exact.
"""
from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    """Delay ``n`` is uniform in ``[d * (1 - jitter), d]`` with ``d = min(maximum, initial * factor**n)``."""

    def __init__(self, initial: float = 0.05, maximum: float = 5.0, factor: float = 2.0, jitter: float = 0.5,
                 rng: random.Random | None = None) -> None:
        if not (0 < initial <= maximum and factor >= 1 and 0 <= jitter <= 1):
            raise ValueError("Backoff needs 0 < initial <= maximum, factor >= 1, 0 <= jitter <= 1")
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self._rng = rng or random.Random()
        self.attempts = 0

    def next_delay(self) -> float:
        base = min(self.maximum, self.initial * self.factor ** min(self.attempts, 64))
        self.attempts += 1
        return base * (1 - self.jitter) + self._rng.random() * base * self.jitter

    def reset(self) -> None:
        self.attempts = 0
