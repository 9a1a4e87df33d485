"""``clients.redirects.DocumentRoute``: the hops of one document request, fed with answers.

421s go to the node they name (waiting only before a node already asked), ``503
partition-not-active`` is asked again on the same node after a short, growing, jittered wait
(``moving_backoff``), anything else ends the route; each kind has its own bound, so a redirect
loop and a long move both end."""
from __future__ import annotations

import random

import pytest

from clients.redirects import MAX_HOPS, MAX_RETRIES, DocumentRoute, Hop, is_moving, moving_backoff, revisit_delay

A, B = "http://a:1", "http://b:2"
MOVING = {"type": "https://upr.dev/problems/partition-not-active", "status": 503}
IMPOSSIBLE = {"type": "https://upr.dev/problems/durability-impossible", "status": 503}


def misdirected(url: str) -> dict[str, object]:
    return {"type": "https://upr.dev/problems/misdirected-request", "status": 421, "url": url}


@pytest.mark.parametrize(
    ("status", "body", "moving"),
    [(503, MOVING, True), (503, IMPOSSIBLE, False), (503, None, False), (421, MOVING, False),
     (503, {"type": 7}, False), (200, MOVING, False)],
)
def test_which_answers_mean_the_partition_is_moving(status: int, body: object, moving: bool) -> None:
    assert is_moving(status, body) is moving


@pytest.mark.parametrize(
    ("answers", "hops"),
    [
        ([(200, {})], []),
        ([(404, None)], []),
        ([(503, IMPOSSIBLE)], []),
        ([(421, misdirected(B)), (200, {})], [Hop(B, 0.0)]),
        # back to a node already asked: a moment for the map to spread
        ([(421, misdirected(B)), (421, misdirected(A)), (200, {})], [Hop(B, 0.0), Hop(A, revisit_delay(1))]),
        ([(503, MOVING), (200, {})], [Hop(A, "retry 0")]),
        # moved while retried: the redirect that follows counts as one, the retry as the other,
        # and the waits on the node it names start short again
        ([(503, MOVING), (421, misdirected(B)), (503, MOVING), (200, {})],
         [Hop(A, "retry 0"), Hop(B, 0.0), Hop(B, "first wait, second draw")]),
    ],
)
def test_routes(answers: list[tuple[int, object]], hops: list[Hop]) -> None:
    # "retry n": the n-th wait of the same seeded backoff the route draws from
    expected = moving_backoff(random.Random(7))
    waits = [expected.next_delay() for _ in range(MAX_RETRIES)]
    again = moving_backoff(random.Random(7))
    again.next_delay()
    again.reset()
    restarted = again.next_delay()  # the first wait's span, with the seeded source's second draw
    hops = [Hop(h.url, restarted if h.delay.startswith("first") else waits[int(h.delay.split()[1])])
            if isinstance(h.delay, str) else h for h in hops]
    route, taken = DocumentRoute(A, backoff=moving_backoff(random.Random(7))), []
    for status, body in answers:
        hop = route.next(status, body)
        if hop is None:
            break
        taken.append(hop)
    assert taken == hops


def test_a_redirect_loop_and_a_long_move_each_end() -> None:
    loop = DocumentRoute(A)
    urls = [B, A] * MAX_HOPS
    assert [loop.next(421, misdirected(u)) is not None for u in urls][:MAX_HOPS + 1] == [True] * MAX_HOPS + [False]
    assert loop.describe("PUT 'k'") == f"PUT 'k' (after following {MAX_HOPS} misdirections)"
    move = DocumentRoute(A)
    assert [move.next(503, MOVING) is not None for _ in range(MAX_RETRIES + 1)] == [True] * MAX_RETRIES + [False]
    assert f"asking {MAX_RETRIES} more times while the partition moved" in move.describe("PUT 'k'")


def test_retries_start_short_spread_out_and_outlast_a_handover_pause() -> None:
    """The first retry comes within 10 ms; writers turned away by the same handover draw
    different waits; all the retries together outlast the source's 1 s hold and a pause."""
    routes = [DocumentRoute(A, backoff=moving_backoff(random.Random(seed))) for seed in range(20)]
    first = [r.next(503, MOVING) for r in routes]
    assert all(h is not None and 0.005 <= h.delay <= 0.01 for h in first)
    assert len({h.delay for h in first if h is not None}) == len(routes)
    for seed in range(20):
        waits = []
        route = DocumentRoute(A, backoff=moving_backoff(random.Random(seed)))
        while (hop := route.next(503, MOVING)) is not None:
            waits.append(hop.delay)
        assert len(waits) == MAX_RETRIES
        assert all(0 < w <= 0.4 for w in waits) and waits[1] > waits[0] / 2
        assert 1.0 < sum(waits) < 2.5
