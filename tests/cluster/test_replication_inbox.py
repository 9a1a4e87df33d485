"""The replication connection's inbox and applier, without sockets: the applier takes everything
received meanwhile, in arrival order, and the receiver's failure only after what arrived before
it; a take is applied in order, in engine calls of about ``RUN_ITEMS`` items."""
from __future__ import annotations

import asyncio
import json

import pytest

from app.cluster.lag_trace import TRACE_ENV, ReplicationTrace
from app.cluster.replication import RUN_ITEMS, Inbox, _apply_all
from clients.connection import ReconnectNeeded
from engine.protocol.frames import ItemBatch
from engine.protocol.messages import SnapshotMarker, SnapshotSource
from engine.replica import ItemsStep, MarkerStep


class FakeFeed:
    """A connection whose ``receive`` hands out queued messages, then fails."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()

    async def receive(self) -> tuple[object, int]:
        got = await self.queue.get()
        if isinstance(got, BaseException):
            raise got
        return got, 10

    def receive_buffered(self) -> tuple[object, int] | None:
        return None


class BundleFeed:
    """A connection that receives bundles: the first part by ``receive``, the rest buffered."""

    def __init__(self, bundles: list[list[str]]) -> None:
        self.bundles = bundles
        self.parts: list[str] = []
        self.awaits = 0

    async def receive(self) -> tuple[object, int]:
        self.awaits += 1
        if not self.bundles:
            raise ReconnectNeeded("connection closed (1006)")
        self.parts = list(self.bundles.pop(0))
        return self.parts.pop(0), 10

    def receive_buffered(self) -> tuple[object, int] | None:
        return (self.parts.pop(0), 10) if self.parts else None


def test_a_bundles_parts_are_taken_in_order_with_one_await_per_bundle() -> None:
    async def scenario() -> None:
        feed, inbox = BundleFeed([["a", "b", "c"], ["d"], ["e", "f"]]), Inbox()
        await asyncio.wait_for(inbox.fill(feed), 5)  # type: ignore[arg-type]
        assert await inbox.take_all() == [(m, 10) for m in "abcdef"]
        assert feed.awaits == 4  # three bundles and the failure
        with pytest.raises(ReconnectNeeded):
            await inbox.take_all()

    asyncio.run(scenario())


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


class RecordingEngine:
    def __init__(self) -> None:
        self.calls: list[list[object]] = []

    def apply_replica_run(self, steps: list[object]) -> None:
        self.calls.append(list(steps))


def batch(partition: int, first: int, n: int, last: bool = False) -> ItemBatch:
    seqnos = list(range(first, first + n))
    return ItemBatch(partition, last, seqnos, [1] * n, [1] * n, bytes(n), [f"k{s}".encode() for s in seqnos],
                     [b"v"] * n)


def test_a_large_take_is_applied_in_engine_calls_of_about_run_items_each_in_order() -> None:
    engine = RecordingEngine()
    per = RUN_ITEMS // 4
    messages = [SnapshotMarker(0, 1, 10 * per, SnapshotSource.MEMORY)] + [batch(0, 1 + i * per, per, last=i == 9) for i in range(10)]
    _apply_all(engine, messages)  # type: ignore[arg-type]
    assert [sum(len(s.items) for s in call if type(s) is ItemsStep) for call in engine.calls] == [
        RUN_ITEMS, RUN_ITEMS, 2 * per]
    steps = [s for call in engine.calls for s in call]
    assert steps[0] == MarkerStep(0, 1, 10 * per)
    assert [s.items[0].seqno for s in steps[1:]] == [1 + i * per for i in range(10)]
    assert [s.last for s in steps[1:]] == [False] * 9 + [True]


def test_a_small_take_is_one_engine_call() -> None:
    engine = RecordingEngine()
    _apply_all(engine, [SnapshotMarker(2, 1, 3, SnapshotSource.MEMORY), batch(2, 1, 3, last=True), SnapshotMarker(1, 1, 1, SnapshotSource.MEMORY),  # type: ignore[arg-type]
                        batch(1, 1, 1, last=True)])
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 4


def test_a_stamped_inbox_and_the_trace_record_each_received_batch(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    assert ReplicationTrace.from_env() is None  # off by default
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(path))
    trace = ReplicationTrace.from_env()
    assert trace is not None

    async def scenario() -> None:
        inbox = Inbox(stamped=True)
        marker = SnapshotMarker(3, 1, 4, SnapshotSource.MEMORY)
        inbox.put((marker, 10))
        inbox.put((batch(3, 1, 4, last=True), 10))
        inbox.put((batch(5, 7, 0), 10))  # an empty batch carries no write
        received = await inbox.take_all()
        assert len(inbox.taken_arrivals) == 3 and inbox.taken_arrivals == sorted(inbox.taken_arrivals)
        trace.record(received, inbox.taken_arrivals, 100.0, 100.5)

    asyncio.run(scenario())
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    partition, seqno, arrived, taken, applied = json.loads(lines[0])
    assert (partition, seqno, taken, applied) == (3, 4, 100.0, 100.5) and arrived > 0
