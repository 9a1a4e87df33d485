"""In-process stand-ins for what a stream connection writes to.

``StreamServer`` takes metrics objects and, behind a real uvicorn, writes frames straight to the
transport of uvicorn's sans-I/O WebSocket protocol (``app.stream.rawframes``).  Tests and benches
that run connections without a server use these instead: metrics that record nothing, and a
protocol of the same name whose transport hands each message's parts (frame header first) to a
callback, so the direct write path runs exactly as it would on a socket.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from app.runner import EngineRunner
from app.stream.connection import StreamLimits
from app.stream.rawframes import RAW_SEND_KEY
from app.stream.server import StreamServer
from app.streams_registry import StreamRegistry
from engine.config import EngineConfig
from engine.engine import Engine

#: receives one message's parts: the frame header, then the payload's pieces
FrameSink = Callable[[Iterable[bytes]], None]


class NullCounter:
    """A Prometheus-like counter/histogram that records nothing."""

    def labels(self, *_: Any) -> "NullCounter":
        return self

    def inc(self, *_: Any) -> None:
        pass

    def observe(self, *_: Any) -> None:
        pass


class NullMetrics:
    """The metrics ``StreamServer`` reads, all recording nothing."""

    rollbacks = stream_bytes = delivery = cursor_drops = NullCounter()


class _Transport:
    def __init__(self, sink: FrameSink) -> None:
        self._sink = sink

    def writelines(self, parts: Iterable[bytes]) -> None:
        self._sink(parts)

    def is_closing(self) -> bool:
        return False


class _Conn:
    def __init__(self) -> None:
        from websockets.protocol import OPEN
        self.state = OPEN
        self.extensions: list[Any] = []
        self.expect_continuation_frame = False


class WebSocketsSansIOProtocol:
    """Named as uvicorn's protocol, so ``RawFrames.of`` takes it and writes to its transport."""

    def __init__(self, sink: FrameSink) -> None:
        self.transport = _Transport(sink)
        self.conn = _Conn()
        self.writable = asyncio.Event()
        self.writable.set()
        self.handshake_complete = True
        self.close_sent = False
        self.disconnected = False

    async def send(self, message: Any) -> None:
        raise AssertionError("unused: the connection writes frames to the transport")


def raw_scope(sink: FrameSink) -> dict[str, Any]:
    """An ASGI scope fragment offering direct frame writes to ``sink``."""
    return {RAW_SEND_KEY: WebSocketsSansIOProtocol(sink).send}


class InProcessStreams:
    """A real engine and ``StreamServer`` in this process, serving stand-in sockets: what the
    direct-pass tests and ``bench.bench_passes`` run their connections on."""

    def __init__(self, data_dir: Path, partitions: int, limits: StreamLimits | None = None) -> None:
        self.engine = Engine.open(EngineConfig(data_dir=data_dir, partitions=partitions))
        self.runner = EngineRunner(self.engine)
        self.server = StreamServer(engine=self.engine, runner=self.runner, limits=limits or StreamLimits(),
                                   streams=StreamRegistry(), metrics=NullMetrics(), stream_metrics=NullMetrics())
        self._tasks: list[asyncio.Task[None]] = []

    def serve(self, sockets: Iterable[Any]) -> None:
        """Serve each socket on a task of its own (they start at the caller's next await)."""
        self._tasks += [asyncio.create_task(self.server.serve(ws)) for ws in sockets]

    async def close(self) -> None:
        await self.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.runner.shutdown()
        self.engine.close()
