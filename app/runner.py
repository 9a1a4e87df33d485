"""Calls into the synchronous engine from the event loop, off the event loop.

WHY a writer thread and a reader pool: the engine serialises writes anyway, so one writer
thread (``app.writer_thread``: one loop wake-up per run of jobs) keeps them in arrival order
without lock contention, while reads (LMDB read transactions, stats) get
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

from app.writer_thread import LoopInbox, WriterThread
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


def _settle(done: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    """On the loop: the job's outcome into its future, unless the caller went away."""
    if done.done():  # the caller went away (client disconnect)
        return
    if exc is not None:
        done.set_exception(exc)
    else:
        done.set_result(result)


def _outcome(f: concurrent.futures.Future[None]) -> BaseException | None:
    return concurrent.futures.CancelledError() if f.cancelled() else f.exception()


class EngineRunner:
    def __init__(self, engine: Engine, read_threads: int = 4) -> None:
        self.engine = engine
        self._writer = WriterThread("upr-writer")
        self._readers = concurrent.futures.ThreadPoolExecutor(read_threads, thread_name_prefix="upr-reader")
        self._inbox: LoopInbox | None = None
        self._pending: list[_Pending] = []
        self._inflight = False
        self.groups = 0
        self.grouped_writes = 0

    def _inbox_of(self, loop: asyncio.AbstractEventLoop) -> LoopInbox:
        inbox = self._inbox
        if inbox is None or inbox.loop is not loop:
            inbox = self._inbox = LoopInbox(loop)
        return inbox

    @property
    def writer_thread(self) -> WriterThread:
        """The writer thread (its ``runs`` and ``jobs`` counters: tests, benchmarks)."""
        return self._writer

    async def write(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the single writer thread (``write_durable`` with nothing to persist)."""
        return await self.write_durable(lambda: (fn(*args, **kwargs), None))

    async def write_durable(self, fn: Callable[P, tuple[T, concurrent.futures.Future[None] | None]],
                            *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the writer thread; it returns its result and a persist future (or None).
        Returns the result once that future (if any) is done, raising its error if it failed.

        WHY not ``await write(...)`` then ``await wrap_future(persist)``: each of those wakes
        the event loop from another thread, and such a wake-up showed as ≈ 7 % of the writer
        thread's GIL time under bulk load (py-spy, docs/benchmarks.md); here the loop is woken
        once, by whichever thread finishes last (and the writer's once per run of jobs)."""
        loop = asyncio.get_running_loop()
        inbox = self._inbox_of(loop)
        done: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                result, persisted = fn(*args, **kwargs)
            except BaseException as exc:  # the caller gets it, whatever it is: never a hang
                inbox.post(_settle, done, None, exc)
                return
            if persisted is None or persisted.done():
                inbox.post(_settle, done, result, None if persisted is None else _outcome(persisted))
            else:  # settled on the flusher thread, which wakes the loop itself
                persisted.add_done_callback(lambda f: inbox.post_and_wake(_settle, done, result, _outcome(f)))

        self._writer.submit(job, inbox)
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
        inbox = self._inbox_of(loop)
        engine = self.engine
        ops, persist = [g[0] for g in group], [g[1] for g in group]

        def job() -> None:
            try:
                out = _write_group(engine, ops, persist)
            except BaseException as exc:  # the caller gets it, whatever it is: never a hang
                inbox.post(self._group_done, loop, group, None, exc)
            else:
                inbox.post(self._group_done, loop, group, out, None)

        try:
            self._writer.submit(job, inbox)
        except RuntimeError as exc:  # the writer thread is shut down
            self._inflight = False
            for _, _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)

    def _group_done(self, loop: asyncio.AbstractEventLoop, group: list[_Pending], out: Any,
                    exc: BaseException | None) -> None:
        self._inflight = False
        if exc is not None:
            for _, _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)
        else:
            results, persist_cf = out
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
        self._writer.shutdown()
        self._readers.shutdown(wait=True, cancel_futures=True)


def _retrieve(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()
