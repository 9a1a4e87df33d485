"""Calls into the synchronous engine from the event loop, off the event loop.

WHY two executors: the engine serialises writes anyway, so one writer thread keeps them
in arrival order without lock contention, while reads (LMDB read transactions, stats) get
a few threads of their own so a long read never delays a write.  LMDB is never touched on
the event loop thread.

WHY group single writes (``write_one``): handing one request to a thread and back costs
more than the write itself.  While one group is on the writer thread, newly arriving
single-document writes queue on the loop; when the group finishes they go together as
one ``engine.write_batch`` with at most one ``persist_future`` (the "group commit" of
databases).  An idle server sends a lone write at once, so batching adds no latency.
A failed item fails only its own request.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from engine.core.errors import UprError
from engine.core.types import WriteOp, WriteResult

if TYPE_CHECKING:
    from engine.engine import Engine

P = ParamSpec("P")
T = TypeVar("T")

_Pending = tuple[WriteOp, bool, "asyncio.Future[tuple[WriteResult, asyncio.Future[None] | None]]"]


def _write_group(engine: Engine, ops: Sequence[WriteOp], persist: Sequence[bool]) -> tuple[list[Any], Any]:
    """Writer thread: one batch for the whole group, one persist future for its persist items."""
    results = engine.write_batch(ops)
    targets: dict[int, int] = {}
    for res, wants in zip(results, persist):
        if wants and not isinstance(res, UprError) and res.seqno > targets.get(res.partition, 0):
            targets[res.partition] = res.seqno
    return results, (engine.persist_future(targets) if targets else None)


class EngineRunner:
    def __init__(self, engine: Engine, read_threads: int = 4) -> None:
        self.engine = engine
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="upr-writer")
        self._readers = concurrent.futures.ThreadPoolExecutor(read_threads, thread_name_prefix="upr-reader")
        self._pending: list[_Pending] = []
        self._inflight = False
        self.groups = 0
        self.grouped_writes = 0

    async def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the single writer thread."""
        return await asyncio.wrap_future(self._writer.submit(fn, *args, **kwargs))

    async def write_durable(self, fn: Callable[P, tuple[T, concurrent.futures.Future[None] | None]],
                            *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the writer thread; it returns its result and a persist future (or None).
        Returns the result once that future (if any) is done, raising its error if it failed.

        WHY not ``await write(...)`` then ``await wrap_future(persist)``: each of those wakes
        the event loop from another thread, and such a wake-up showed as ≈ 7 % of the writer
        thread's GIL time under bulk load (py-spy, docs/benchmarks.md); here the loop is woken
        once, by whichever thread finishes last."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, exc: BaseException | None) -> None:  # on the loop
            if done.done():  # the caller went away (client disconnect)
                return
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(result)

        def wake(result: Any, exc: BaseException | None) -> None:  # on the writer or flusher thread
            try:
                loop.call_soon_threadsafe(settle, result, exc)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        def job() -> None:
            try:
                result, persisted = fn(*args, **kwargs)
            except Exception as exc:
                wake(None, exc)
                return
            if persisted is None:
                wake(result, None)
            else:
                persisted.add_done_callback(
                    lambda f: wake(result, concurrent.futures.CancelledError() if f.cancelled() else f.exception()))

        self._writer.submit(job)
        return await done

    async def read(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on a reader thread."""
        return await asyncio.wrap_future(self._readers.submit(fn, *args, **kwargs))

    async def persist(self, targets: Mapping[int, int]) -> None:
        """Wait until ``persisted_seqno[p] >= targets[p]`` for every partition."""
        if targets:
            await asyncio.wrap_future(self.engine.persist_future(targets))

    async def write_one(self, op: WriteOp, persist: bool = False) -> WriteResult:
        """Write one document (grouped with concurrent ones); with ``persist``, return once fsynced.

        Raises the item's ``UprError`` (or the whole group's, e.g. ``Backpressure``)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[WriteResult, asyncio.Future[None] | None]] = loop.create_future()
        self._pending.append((op, persist, future))
        if not self._inflight:
            self._send_group(loop)
        result, persisted = await future
        if persisted is not None:
            await persisted
        return result

    def _send_group(self, loop: asyncio.AbstractEventLoop) -> None:
        group, self._pending = self._pending, []
        self._inflight = True
        self.groups += 1
        self.grouped_writes += len(group)
        try:
            cf = self._writer.submit(_write_group, self.engine, [g[0] for g in group], [g[1] for g in group])
        except RuntimeError as exc:  # executor shut down
            self._inflight = False
            for _, _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)
            return
        cf.add_done_callback(lambda f: loop.call_soon_threadsafe(self._group_done, loop, group, f))

    def _group_done(self, loop: asyncio.AbstractEventLoop, group: list[_Pending], cf: concurrent.futures.Future[Any]) -> None:
        self._inflight = False
        exc = cf.exception()
        if exc is not None:
            for _, _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)
        else:
            results, persist_cf = cf.result()
            shared: asyncio.Future[None] | None = None
            if persist_cf is not None:
                shared = asyncio.wrap_future(persist_cf, loop=loop)
                shared.add_done_callback(_retrieve)  # waiters may all have gone (client disconnects)
            for (_, persist, fut), res in zip(group, results):
                if fut.done():
                    continue
                if isinstance(res, UprError):
                    fut.set_exception(res)
                else:
                    fut.set_result((res, shared if persist else None))
        if self._pending:
            self._send_group(loop)

    def shutdown(self) -> None:
        self._writer.shutdown(wait=True, cancel_futures=False)
        self._readers.shutdown(wait=True, cancel_futures=True)


def _retrieve(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()
