"""A write that reaches a handover's source after it stopped the partition's writes is refused on
the event loop, without a turn of the writer thread, then waits for the switch and leaves with a
421 naming the target, as the engine's own refusal would have; other partitions write as usual.

The real app and engine in-process; the node's cluster half is a stand-in with the participant's
answers (``HandoverParticipant`` is tested against real etcd in ``test_handover_driver.py``)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.asgi import InProcessApp, in_process_app
from tests.support.keys import key_in
from tests.support.problems import problem

PARTITIONS = 8
P = 3
TARGET = "http://127.0.0.1:9"


class _Source:
    """The participant's answers for node ``n1``, the source of ``P``'s handover to ``n2``."""

    def __init__(self) -> None:
        self.records = {P: object()}
        self.switched = asyncio.Event()
        self.parked = 0

    def taking_over(self, partition: int) -> bool:
        return False

    def in_handover(self, partition: int) -> bool:
        return partition == P

    def switching_to(self, partition: int) -> str | None:
        return "n2" if self.switched.is_set() and partition == P else None

    async def until_settled(self, partition: int, timeout_s: float) -> bool:
        self.parked += 1
        await asyncio.wait_for(self.switched.wait(), timeout_s)
        return True


@pytest.fixture
async def source(tmp_path: Path) -> AsyncIterator[tuple[InProcessApp, _Source]]:
    async with in_process_app(tmp_path / "data", partitions=PARTITIONS) as app:
        handover = _Source()

        def misdirected(partition: int) -> dict:
            active = handover.switching_to(partition) or "n1"
            return {"active": active, "url": TARGET if active == "n2" else None, "map_revision": 1}

        app.app.state.cluster = SimpleNamespace(name="n1", handover=handover, misdirected=misdirected, durable=None)
        try:
            yield app, handover
        finally:
            app.app.state.cluster = None


async def test_a_write_to_a_stopped_partition_is_refused_without_the_writer_and_sent_to_the_target(source) -> None:
    app, handover = source
    runner = app.app.state.runner
    engine = runner.engine
    fenced_at = engine.stop_writes(P)
    groups = runner.groups
    put = asyncio.create_task(app.client.put(f"/docs/{key_in(P, 'k')}", content=b"v"))
    while handover.parked == 0:
        await asyncio.sleep(0.001)  # parked until the switch is sent
    assert not put.done()
    handover.switched.set()
    body = problem(await put, 421, "misdirected-request")
    assert (body["partition"], body["url"]) == (P, TARGET)
    assert runner.groups == groups  # never handed to the writer thread
    assert engine.high_seqno(P) == fenced_at
    other = await app.client.put(f"/docs/{key_in(1, 'k')}", content=b"v")
    assert other.status_code == 200, other.text
    assert runner.groups == groups + 1
