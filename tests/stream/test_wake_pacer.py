"""WakePacer: changes go out at once on an idle loop, gathered on a busy one with many consumers."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from app.stream.hub import ChangeHub
from app.stream.pacing import WakePacer

A, B = frozenset({1}), frozenset({2, 3})


def _paced_hub() -> tuple[ChangeHub, Callable[[int], None]]:
    """A hub on the running loop whose pacer holds deliveries once the loop is 0.2 s late (long
    enough for a loaded machine), and the engine's change mark it listens to."""
    listeners: list[Callable[[int], None]] = []

    def add_listener(cb: Callable[[int], None]) -> Callable[[], None]:
        listeners.append(cb)
        return lambda: listeners.remove(cb)

    hub = ChangeHub(add_listener, asyncio.get_running_loop(),  # type: ignore[arg-type]
                    pacer=WakePacer(busy_after_s=0.2, gather_s=1.0))
    return hub, listeners[0]


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
    hub, mark = _paced_hub()
    # generous times: the machine may be loaded; only the order of events is asserted
    got: list[frozenset[int]] = []

    class Sub:
        def notify(self, partitions: frozenset[int]) -> None:
            got.append(partitions)

    for _ in range(8):
        hub.subscribe(Sub())
    mark(1)
    for _ in range(3):
        await asyncio.sleep(0)
    assert got == [frozenset({1})] * 8  # idle loop: at once
    got.clear()
    mark(2)
    time.sleep(0.25)  # the loop is busy: the delivery callback waits behind this
    await asyncio.sleep(0)
    mark(3)
    await asyncio.sleep(0)
    assert got == []  # held (with the change that arrived meanwhile)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert got == [frozenset({2, 3})] * 8
    hub.close()


async def test_replication_streams_are_woken_at_once_and_not_counted_for_pacing() -> None:
    hub, mark = _paced_hub()
    got: dict[str, list[frozenset[int]]] = {"consumer": [], "replica": []}

    class Sub:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def notify(self, partitions: frozenset[int]) -> None:
            got[self.kind].append(partitions)

    consumers = [Sub("consumer") for _ in range(7)]
    replicas = [Sub("replica") for _ in range(3)]
    for sub in (*consumers, *replicas):
        hub.subscribe(sub)
    for replica in replicas:
        hub.set_prompt(replica)  # their hello named them replication streams

    async def busy_delivery(p: int) -> None:
        mark(p)
        time.sleep(0.25)  # the loop is busy: the delivery callback waits behind this
        for _ in range(3):
            await asyncio.sleep(0)

    await busy_delivery(1)
    # 7 paced consumers (replicas not counted) are below min_subscribers: nobody is held
    assert got == {"consumer": [frozenset({1})] * 7, "replica": [frozenset({1})] * 3}
    hub.subscribe(Sub("consumer"))  # the eighth consumer: pacing applies to the consumers only
    got = {"consumer": [], "replica": []}
    await busy_delivery(2)
    assert got == {"consumer": [], "replica": [frozenset({2})] * 3}
    deadline = time.monotonic() + 5
    while not got["consumer"] and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert got["consumer"] == [frozenset({2})] * 8
    hub.unsubscribe(replicas[0])
    hub.close()


def test_deliveries_to_many_subscribers_are_spaced_and_a_change_after_a_quiet_spell_goes_at_once() -> None:
    pacer = WakePacer(busy_after_s=0.001, gather_s=0.002, spacing_per_subscriber_s=0.0001, max_spacing_s=0.005)
    assert pacer.spacing(50) == 0.005 and pacer.spacing(20) == 0.002 and pacer.spacing(7) == 0.0
    assert pacer.offer(A, 0.0, 50, now=10.0) == A  # the first change: at once
    assert pacer.offer(B, 0.0, 50, now=10.001) is None  # within the spacing: held until it has passed
    assert pacer.release_at == 10.005
    assert pacer.offer(A, 0.0, 50, now=10.003) is None  # joins the held ones
    assert pacer.release(10.005) == A | B
    assert pacer.offer(B, 0.0, 50, now=10.020) == B  # after a quiet spell: at once
    assert pacer.offer(A, 0.0, 7, now=10.021) == A  # too few subscribers: never spaced
    assert pacer.offer(A, 0.0020, 50, now=10.100) is None  # a busy loop still gathers gather_s
    assert pacer.release_at == 10.100 + 0.002


@pytest.mark.parametrize("subscribers, expected_per_second", [(50, 200), (20, 500), (4, 1000)])
def test_spacing_bounds_the_deliveries_whatever_the_write_rate(subscribers: int, expected_per_second: int) -> None:
    """1,000 changes a second, one every millisecond: at most one delivery per spacing (the held
    changes released on time), so each pass carries every change of that interval."""
    pacer = WakePacer()
    delivered = 0
    for ms in range(1000):
        now = ms / 1000
        if pacer.holding and pacer.release_at is not None and now >= pacer.release_at - 1e-9:
            delivered += bool(pacer.release(now))
        delivered += pacer.offer(frozenset({ms % 64}), 0.0, subscribers, now) is not None
    assert abs(delivered - expected_per_second) <= 2
