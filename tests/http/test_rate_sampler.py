"""``app.routes.status.RateSampler``: rates over a sliding window for /status."""
from __future__ import annotations

from app.routes.status import RateSampler


def test_rate_sampler() -> None:
    s = RateSampler(window=1.0)
    assert s.update(0, 10.0) == 0.0
    assert s.update(5, 10.5) == 0.0
    assert s.update(20, 12.0) == 10.0
    assert s.update(21, 12.1) == 10.0
