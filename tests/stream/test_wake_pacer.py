"""WakePacer: changes go out at once on an idle loop, gathered on a busy one with many consumers."""
from __future__ import annotations

import pytest

from app.stream.pacing import WakePacer

A, B = frozenset({1}), frozenset({2, 3})


@pytest.mark.parametrize("waited_s, subscribers, gather_s, held", [
    (0.0001, 50, 0.002, False),  # idle loop: a lone write is never held
    (0.0009, 50, 0.002, False),
    (0.001, 50, 0.002, True),  # the loop's queue reached busy_after_s
    (0.050, 50, 0.002, True),
    (0.050, 7, 0.002, False),  # a few consumers (replicas, one tail): never paced
    (0.050, 50, 0.0, False),  # pacing off
])
def test_a_delivery_is_held_only_on_a_busy_loop_with_many_consumers(waited_s: float, subscribers: int,
                                                                     gather_s: float, held: bool) -> None:
    pacer = WakePacer(busy_after_s=0.001, gather_s=gather_s, min_subscribers=8)
    out = pacer.offer(A, waited_s, subscribers)
    assert (out is None) == held
    assert pacer.holding == held
    if not held:
        assert out == A


def test_while_holding_every_delivery_joins_and_release_gives_them_all_once() -> None:
    pacer = WakePacer()
    assert pacer.offer(A, 0.01, 50) is None
    assert pacer.offer(B, 0.0, 50) is None  # an idle-looking delivery still joins the held ones
    assert pacer.release() == A | B
    assert not pacer.holding and pacer.release() == frozenset()
    assert pacer.offer(B, 0.0, 50) == B  # after the release: judged afresh


def test_negative_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        WakePacer(gather_s=-1)


async def test_the_hub_gathers_changes_on_a_busy_loop_and_delivers_them_together() -> None:
    import asyncio
    import time

    from app.stream.hub import ChangeHub

    listeners: list[object] = []

    def add_listener(cb: object) -> object:
        listeners.append(cb)
        return lambda: listeners.remove(cb)

    hub = ChangeHub(add_listener, asyncio.get_running_loop(), pacer=WakePacer(busy_after_s=0.2, gather_s=1.0))
    # generous times: the machine may be loaded; only the order of events is asserted
    got: list[frozenset[int]] = []

    class Sub:
        def notify(self, partitions: frozenset[int]) -> None:
            got.append(partitions)

    for _ in range(8):
        hub.subscribe(Sub())
    mark = listeners[0]
    mark(1)  # type: ignore[operator]
    for _ in range(3):
        await asyncio.sleep(0)
    assert got == [frozenset({1})] * 8  # idle loop: at once
    got.clear()
    mark(2)  # type: ignore[operator]
    time.sleep(0.25)  # the loop is busy: the delivery callback waits behind this
    await asyncio.sleep(0)
    mark(3)  # type: ignore[operator]
    await asyncio.sleep(0)
    assert got == []  # held (with the change that arrived meanwhile)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert got == [frozenset({2, 3})] * 8
    hub.close()
