"""A blocking wrapper around ``Consumer`` for scripts and Spark tasks.

It owns a private event loop and drives the async consumer on the calling thread
(``loop.run_until_complete`` per step), so there is no thread hand-off per event and nothing runs
in the background between calls: when the caller stops pulling, the consumer stops reading, and
flow control stops the server.  Do not use it from inside a running event loop (use ``Consumer``).

    with SyncConsumer("http://127.0.0.1:8000", partitions=[3], start="beginning", until_now=True) as c:
        for event in c:
            ...
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from engine.protocol.client.offset import StreamOffset

from .consumer import Consumer, Handler
from .events import BarrierReached, Event

__all__ = ["SyncConsumer"]


class SyncConsumer:
    """Same arguments as ``Consumer``; methods block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._consumer: Consumer = self._loop.run_until_complete(self._make(*args, **kwargs))
        self._closed = False

    @staticmethod
    async def _make(*args: Any, **kwargs: Any) -> Consumer:
        return Consumer(*args, **kwargs)  # created inside the loop so its futures belong to it

    @property
    def consumer(self) -> Consumer:
        return self._consumer

    def connect(self) -> None:
        self._loop.run_until_complete(self._consumer.connect())

    def __enter__(self) -> "SyncConsumer":
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pull(self, it: Any) -> Iterator[Any]:
        run = self._loop.run_until_complete
        nxt = it.__anext__
        while True:
            try:
                yield run(nxt())
            except StopAsyncIteration:
                return

    def __iter__(self) -> Iterator[Event]:
        return self._pull(self._consumer.__aiter__())

    def batches(self) -> Iterator[Any]:
        return self._pull(self._consumer.batches())

    def run(self, handler: Handler | None = None) -> None:
        self._loop.run_until_complete(self._consumer.run(handler))

    def barrier(self, timeout: float | None = None) -> BarrierReached:
        return self._loop.run_until_complete(self._consumer.barrier(timeout))

    def commit(self) -> None:
        self._loop.run_until_complete(self._consumer.commit())

    def committed(self) -> dict[int, StreamOffset]:
        return self._consumer.committed()

    def seek(self, partition: int, offset: StreamOffset) -> None:
        """See ``Consumer.seek`` (e.g. while handling a ``Rollback`` event)."""
        self._consumer.seek(partition, offset)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run_until_complete(self._consumer.close())
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()
