"""The replica's acker, without sockets: it acks what an apply or a flush moved, woken by the
flusher's persist listener from the flusher's thread, and makes no look while nothing moves,
even while a held seqno waits to be persisted."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from app.cluster.replication import ReplicaAcker
from engine.protocol import messages as M


class Engine:
    """What the acker reads: held figures per partition, and a persist listener."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[int, int]] = {}
        self.listeners: list[Callable[[int], None]] = []

    def replica_held(self, p: int) -> tuple[int, int]:
        return self.held.get(p, (0, 0))

    def add_persist_listener(self, callback: Callable[[int], None]) -> Callable[[], None]:
        self.listeners.append(callback)
        return lambda: self.listeners.remove(callback)


class Conn:
    def __init__(self) -> None:
        self.sent: list[list[M.SeqnoAck]] = []
        self.changed = asyncio.Event()

    async def send_bundled(self, acks: list[M.SeqnoAck]) -> None:
        self.sent.append(list(acks))
        self.changed.set()


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
