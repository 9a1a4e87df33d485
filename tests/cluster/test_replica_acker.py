"""The replica's acker, without sockets: it acks what an apply or a flush moved, woken by the
flusher's persist listener from the flusher's thread, and makes no look while nothing moves,
even while a held seqno waits to be persisted; during a take it gathers, and sends one message
at its end; its acks are the protocol's own text."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from app.cluster.replication import ReplicaAcker, ack_text
from engine.protocol import messages as M
from engine.protocol.bundle import decode_bundle
from engine.protocol.encoding import decode
from engine.protocol.message_types import Sender


class Engine:
    """What the acker reads: held figures per partition, and a persist listener."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[int, int]] = {}
        self.listeners: list[Callable[[int], None]] = []
        self.eager: list[bool] = []
        self.replicas_only: list[bool] = []

    def replica_held(self, p: int) -> tuple[int, int]:
        return self.held.get(p, (0, 0))

    def add_persist_listener(self, callback: Callable[[int], None], *, eager: bool = True,
                             replicas_only: bool = False) -> Callable[[], None]:
        self.listeners.append(callback)
        self.eager.append(eager)
        self.replicas_only.append(replicas_only)
        return lambda: self.listeners.remove(callback)


class Socket:
    """The WebSocket the acker writes to: each message decoded as the active's session would."""

    def __init__(self, conn: "Conn") -> None:
        self.conn = conn

    async def send(self, message: str | bytes) -> None:
        parts = decode_bundle(message) if isinstance(message, bytes) else [message]
        self.conn.sent.append([decode(part, sender=Sender.CLIENT) for part in parts])
        self.conn.changed.set()


class Conn:
    def __init__(self) -> None:
        self.sent: list[list[M.SeqnoAck]] = []
        self.changed = asyncio.Event()
        self.ws = Socket(self)


async def _next(conn: Conn) -> list[M.SeqnoAck]:
    await asyncio.wait_for(conn.changed.wait(), 30)
    conn.changed.clear()
    return conn.sent[-1]


def test_acks_follow_applies_and_the_flushers_word_without_polling() -> None:
    async def scenario() -> None:
        engine, conn = Engine(), Conn()
        acker = ReplicaAcker(engine, poll_s=3600.0)  # the safety net out of reach
        task = asyncio.create_task(acker.run(conn))  # type: ignore[arg-type]
        try:
            await asyncio.sleep(0)
            assert len(engine.listeners) == 1
            assert engine.eager == [True]  # persist_majority writes wait on this copy's rounds
            assert engine.replicas_only == [True]  # ... and only on them: own writes may gather
            engine.held = {3: (10, 0), 4: (5, 5)}
            acker.applied(3)
            acker.applied(4)
            assert await _next(conn) == [M.SeqnoAck(3, 10, 0), M.SeqnoAck(4, 5, 5)]
            looks = acker.looks
            await asyncio.sleep(0.2)  # partition 3 waits for the flusher: no look meanwhile
            assert acker.looks == looks
            engine.held[3] = (10, 10)
            flusher = threading.Thread(target=lambda: [cb(p) for p in (3, 9) for cb in list(engine.listeners)])
            flusher.start()
            flusher.join()
            assert await _next(conn) == [M.SeqnoAck(3, 10, 10)]  # 9 is not streamed here: ignored
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert engine.listeners == []  # removed with the connection

    asyncio.run(scenario())


def test_a_take_sends_one_message_with_what_a_flush_round_moved_meanwhile() -> None:
    async def scenario() -> None:
        engine, conn = Engine(), Conn()
        acker = ReplicaAcker(engine, poll_s=3600.0)
        task = asyncio.create_task(acker.run(conn))  # type: ignore[arg-type]
        try:
            await asyncio.sleep(0)
            engine.held = {1: (4, 0), 2: (6, 0)}
            acker.applied(1)
            acker.applied(2)
            assert await _next(conn) == [M.SeqnoAck(1, 4, 0), M.SeqnoAck(2, 6, 0)]
            acker.begin_take()
            engine.held = {1: (4, 4), 2: (9, 6)}
            engine.listeners[0](1)  # a flush round persisted partition 1 (here on the loop's thread)
            acker.applied(2)
            await asyncio.sleep(0.05)
            assert len(conn.sent) == 1  # nothing leaves during the take
            acker.end_take()
            assert await _next(conn) == [M.SeqnoAck(1, 4, 4), M.SeqnoAck(2, 9, 6)]
            assert len(conn.sent) == 2
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_a_handover_targets_partition_is_acked_at_once_during_a_take() -> None:
    async def scenario() -> None:
        engine, conn = Engine(), Conn()
        acker = ReplicaAcker(engine, poll_s=3600.0, at_once=lambda p: p == 7)
        task = asyncio.create_task(acker.run(conn))  # type: ignore[arg-type]
        try:
            await asyncio.sleep(0)
            acker.begin_take()
            engine.held = {2: (3, 0), 7: (5, 0)}
            acker.applied(2)
            await asyncio.sleep(0.05)
            assert conn.sent == []  # an ordinary partition's ack gathers until the take ends
            acker.applied(7)  # the source's write pause waits for this one: it leaves now
            assert await _next(conn) == [M.SeqnoAck(2, 3, 0), M.SeqnoAck(7, 5, 0)]
            acker.end_take()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


@pytest.mark.parametrize("figures", [(0, 0, 0), (3, 10, 7), (1023, 2**48, 2**47)])
def test_ack_text_is_the_protocols_encoding(figures: tuple[int, int, int]) -> None:
    assert ack_text(*figures) == M.encode(M.SeqnoAck(*figures))


def test_the_safety_net_looks_when_nothing_reports_persistence() -> None:
    async def scenario() -> None:
        engine, conn = Engine(), Conn()
        acker = ReplicaAcker(engine, poll_s=0.05)
        task = asyncio.create_task(acker.run(conn))  # type: ignore[arg-type]
        try:
            await asyncio.sleep(0)
            engine.held = {5: (8, 0)}
            acker.applied(5)
            assert await _next(conn) == [M.SeqnoAck(5, 8, 0)]
            engine.held = {5: (8, 8)}  # persisted, and no listener call says so
            assert await _next(conn) == [M.SeqnoAck(5, 8, 8)]
            looks = acker.looks
            await asyncio.sleep(0.3)  # nothing unpersisted any more: no timer, no look
            assert acker.looks == looks
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
