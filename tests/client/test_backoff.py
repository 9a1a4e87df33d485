import random

import pytest

from clients.backoff import Backoff


class Fixed(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize("rnd,expected", [
    (1.0, [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]),      # no jitter taken: capped doubling
    (0.0, [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]),     # full jitter taken: half of each
])
def test_capped_doubling_with_jitter(rnd, expected):
    b = Backoff(initial=0.1, maximum=1.0, jitter=0.5, rng=Fixed(rnd))
    assert [round(b.next_delay(), 6) for _ in expected] == expected
    b.reset()
    assert round(b.next_delay(), 6) == expected[0]


def test_random_delays_stay_in_bounds():
    b = Backoff(initial=0.01, maximum=2.0)
    for _ in range(200):
        d = b.next_delay()
        assert 0.005 <= d <= 2.0


@pytest.mark.parametrize("kw", [{"initial": 0}, {"initial": 3, "maximum": 1}, {"jitter": 2}, {"factor": 0.5}])
def test_bad_config(kw):
    with pytest.raises(ValueError):
        Backoff(**kw)
