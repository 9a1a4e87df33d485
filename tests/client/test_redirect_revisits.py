"""``clients.redirects.revisit_delay``: how long a client waits before asking again a node it
already asked (two nodes naming each other while a new map spreads)."""
from __future__ import annotations

from clients.redirects import revisit_delay


def test_revisits_wait_longer_each_hop_and_at_most_a_second() -> None:
    delays = [revisit_delay(h) for h in range(6)]
    assert delays == sorted(delays) and delays[0] > 0 and max(delays) == 1.0
