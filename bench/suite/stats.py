"""Percentiles and rates: the few numbers the table shows, computed one way for every system."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentiles(values: Iterable[float], ps: Sequence[float]) -> dict[str, float]:
    """Nearest-rank percentiles (p in 0..100) keyed ``"p50"``, ``"p99.9"``, ``"p100"``.

    Nearest rank, not interpolation: every figure reported is a latency that was observed.
    """
    data = sorted(values)
    if not data:
        raise ValueError("no values")
    out = {}
    for p in ps:
        rank = max(1, math.ceil(p * len(data) / 100 - 1e-9))
        out[label(p)] = data[min(rank, len(data)) - 1]
    return out


def label(p: float) -> str:
    return "p" + (f"{p:g}")


def rate(count: int, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("non-positive duration")
    return count / seconds
