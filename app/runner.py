"""Calls into the synchronous engine from the event loop, off the event loop.

WHY two executors: the engine serialises writes anyway, so one writer thread keeps
them in arrival order without lock contention, while reads (LMDB read transactions,
stats) get a few threads of their own so a long read never delays a write.  LMDB is
never touched on the event loop thread.

A ``persist`` write submits the write and asks for its persist future in the same
writer-thread call, then awaits the future on the loop: the flusher resolves many
such futures with one fsync.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from engine.engine import Engine

P = ParamSpec("P")
T = TypeVar("T")


class EngineRunner:
    def __init__(self, engine: Engine, read_threads: int = 4) -> None:
        self.engine = engine
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="upr-writer")
        self._readers = concurrent.futures.ThreadPoolExecutor(read_threads, thread_name_prefix="upr-reader")

    async def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the single writer thread."""
        return await asyncio.wrap_future(self._writer.submit(fn, *args, **kwargs))

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on a reader thread."""
        return await asyncio.wrap_future(self._readers.submit(fn, *args, **kwargs))

    async def persist(self, targets: Mapping[int, int]) -> None:
        """Wait until ``persisted_seqno[p] >= targets[p]`` for every partition."""
        if targets:
            await asyncio.wrap_future(self.engine.persist_future(targets))

    def shutdown(self) -> None:
        self._writer.shutdown(wait=True, cancel_futures=False)
        self._readers.shutdown(wait=True, cancel_futures=True)
