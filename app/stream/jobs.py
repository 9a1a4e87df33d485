"""One reader-thread hop for many connections: stream jobs batched per wake-up.

Theory of operation
-------------------
Every stream visit needs engine reads and encoding off the event loop.  With 50 consumers woken by
the same engine notification, one executor submission per connection costs 50 thread hand-offs
per wake-up (each a thread wake-up and a GIL round trip on a busy machine), far more than the work itself
when the tail cache already holds the encoded frames.  ``JobBatcher`` queues the connections' jobs
and runs everything queued so far in *one* reader-thread call, in arrival order; jobs queued while
calls run go in the next one (``max_in_flight`` calls at once, so one slow thread wake-up does not
stall every connection).  Each caller still awaits its own result (or exception).

Ordering per connection is kept because a connection awaits each job before queueing the next
(``StreamConnection._on_reader``, under its cursor lock).  A caller cancelled while its job is
queued or running does not stop the job: the job's future completes when the job has run, so the
connection can wait for it before releasing its cursors.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["JobBatcher"]


class JobBatcher:
    def __init__(self, submit: Callable[..., Awaitable[Any]], max_in_flight: int = 2) -> None:
        self._submit = submit  # e.g. EngineRunner.read: runs fn(*args) on a reader thread
        self._queue: list[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = []
        #: reader-thread calls at once: more than one hides thread wake-up latency on a busy machine
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self.jobs = 0
        self.hops = 0

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Queue ``fn(*args)``; the future resolves once it ran on a reader thread."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((fn, args, fut))
        self.jobs += 1
        if self._in_flight < self.max_in_flight:
            self._in_flight += 1
            asyncio.ensure_future(self._drain())
        return fut

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                self.hops += 1
                try:
                    results = await self._submit(_run_all, [(fn, args) for fn, args, _ in batch])
                except BaseException as exc:  # noqa: BLE001 - executor gone: every caller hears it
                    results = [(False, exc)] * len(batch)
                for (_, _, fut), (ok, value) in zip(batch, results):
                    if fut.done():
                        continue
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(value)
        finally:
            self._in_flight -= 1


def _run_all(jobs: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[tuple[bool, Any]]:
    out: list[tuple[bool, Any]] = []
    for fn, args in jobs:
        try:
            out.append((True, fn(*args)))
        except Exception as exc:  # noqa: BLE001 - handed to that job's caller
            out.append((False, exc))
    return out
