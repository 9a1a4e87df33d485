"""The replication connection's inbox: the applier takes everything received meanwhile, in
arrival order, and the receiver's failure only after what arrived before it."""
from __future__ import annotations

import asyncio

import pytest

from app.cluster.replication import Inbox
from clients.connection import ReconnectNeeded


class FakeFeed:
    """A connection whose ``receive`` hands out queued messages, then fails."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()

    async def receive(self) -> tuple[object, int]:
        got = await self.queue.get()
        if isinstance(got, BaseException):
            raise got
        return got, 10


def test_take_all_returns_everything_received_in_order() -> None:
    async def scenario() -> None:
        inbox = Inbox()
        for i in range(5):
            inbox.put((i, 10))
        assert await inbox.take_all() == [(i, 10) for i in range(5)]
        inbox.put(("late", 3))
        assert await inbox.take_all() == [("late", 3)]

    asyncio.run(scenario())


def test_take_all_waits_for_the_first_message() -> None:
    async def scenario() -> None:
        inbox = Inbox()
        taker = asyncio.create_task(inbox.take_all())
        await asyncio.sleep(0)
        assert not taker.done()
        inbox.put(("a", 1))
        assert await asyncio.wait_for(taker, 5) == [("a", 1)]

    asyncio.run(scenario())


def test_a_receive_failure_comes_after_what_arrived_before_it() -> None:
    async def scenario() -> None:
        feed, inbox = FakeFeed(), Inbox()
        for item in ("m1", "m2", ReconnectNeeded("connection closed (1006)")):
            feed.queue.put_nowait(item)
        filler = asyncio.create_task(inbox.fill(feed))  # type: ignore[arg-type]
        await asyncio.wait_for(filler, 5)  # ends on the failure, handing it over
        assert await inbox.take_all() == [("m1", 10), ("m2", 10)]
        with pytest.raises(ReconnectNeeded):
            await inbox.take_all()
        with pytest.raises(ReconnectNeeded):  # stays failed
            await inbox.take_all()

    asyncio.run(scenario())
