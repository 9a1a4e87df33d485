"""``app.writer_thread``: jobs run in order on one thread; what queued while the thread was busy
runs as one run with one loop wake-up; results and errors reach their callers; shutdown runs
what is queued.  Also ``EngineRunner.write``/``write_durable`` on it."""
from __future__ import annotations

import asyncio
import threading

import pytest

from app.runner import EngineRunner
from app.writer_thread import LoopInbox, WriterThread


async def test_jobs_queued_while_busy_run_together_with_one_wake() -> None:
    loop = asyncio.get_running_loop()
    inbox = LoopInbox(loop)
    writer = WriterThread("test-writer")
    gate = threading.Event()
    order: list[int] = []
    done = loop.create_future()
    try:
        writer.submit(gate.wait, inbox)
        while writer.jobs == 0:  # the thread holds the first job: the rest queue behind it
            await asyncio.sleep(0.001)
        for i in range(20):
            writer.submit(lambda i=i: (order.append(i), inbox.post(done.set_result, None) if i == 19 else None), inbox)
        wakes = inbox.wakes
        gate.set()
        await asyncio.wait_for(done, 30)
        assert order == list(range(20))
        assert inbox.wakes - wakes == 1  # twenty results, one loop wake-up
        assert writer.runs == 2 and writer.jobs == 21
    finally:
        writer.shutdown()


async def test_a_failing_job_does_not_end_the_thread_and_shutdown_runs_what_is_queued() -> None:
    inbox = LoopInbox(asyncio.get_running_loop())
    writer = WriterThread("test-writer")
    ran: list[str] = []
    writer.submit(lambda: 1 / 0, inbox)
    writer.submit(lambda: ran.append("after"), inbox)
    writer.shutdown()
    assert ran == ["after"]
    with pytest.raises(RuntimeError):
        writer.submit(lambda: None, inbox)
    writer.shutdown()  # twice is fine


async def test_the_runner_settles_writes_on_the_writer_thread() -> None:
    runner = EngineRunner(engine=None)  # type: ignore[arg-type]
    try:
        names = await asyncio.gather(*(runner.write(lambda: threading.current_thread().name) for _ in range(5)))
        assert names == ["upr-writer"] * 5
        with pytest.raises(ZeroDivisionError):
            await runner.write(lambda: 1 / 0)
        assert await runner.write(lambda x, y=0: x + y, 1, y=2) == 3
        cancelled = asyncio.ensure_future(runner.write(threading.Event().wait, 0.05))
        await asyncio.sleep(0)
        cancelled.cancel()  # the caller went away: its result is dropped, the next write is served
        assert await runner.write(lambda: "next") == "next"
    finally:
        runner.shutdown()


async def test_a_change_marked_by_a_job_rides_the_jobs_wake_up_ahead_of_its_answer() -> None:
    """The streams' wake of a write and the write's answer reach the loop in one wake-up, the
    change first; a mark from any other thread still wakes the loop itself."""
    from app.stream.coalesce import CoalescedPartitions

    loop = asyncio.get_running_loop()
    seen: list[object] = []
    marks = CoalescedPartitions(loop, lambda dirty: seen.append(dirty))
    runner = EngineRunner(engine=None)  # type: ignore[arg-type]
    try:
        inbox = runner._inbox_of(loop)
        wakes = inbox.wakes
        answer = await runner.write(lambda: marks.mark_many((3, 5)) or "written")
        seen.append(answer)
        assert seen == [frozenset({3, 5}), "written"]
        assert inbox.wakes - wakes == 1
        other = threading.Thread(target=marks.mark_many, args=((7,),))
        other.start()
        other.join()
        for _ in range(3000):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.01)
        assert seen[2] == frozenset({7}) and inbox.wakes - wakes == 1
    finally:
        runner.shutdown()


async def test_a_mark_from_another_thread_is_not_held_behind_a_running_job() -> None:
    """While a writer job's mark waits in its inbox (the job still runs), a mark from another
    thread (a promotion, a replica's apply) wakes the loop itself; the parked callback then finds
    nothing left."""
    from app.stream.coalesce import CoalescedPartitions

    loop = asyncio.get_running_loop()
    seen: list[frozenset[int]] = []
    marks = CoalescedPartitions(loop, seen.append)
    runner = EngineRunner(engine=None)  # type: ignore[arg-type]
    release, marked = threading.Event(), threading.Event()

    def long_job() -> str:
        marks.mark_many((1,))
        marked.set()
        release.wait(30)
        return "written"

    try:
        job = asyncio.ensure_future(runner.write(long_job))
        await asyncio.to_thread(marked.wait, 30)
        await asyncio.to_thread(marks.mark_many, (2,))   # another thread, while the job runs
        for _ in range(3000):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == [frozenset({1, 2})] and not job.done()
        release.set()
        assert await job == "written"
        assert [dirty for dirty in seen if dirty] == [frozenset({1, 2})]   # the parked one found it taken
    finally:
        release.set()
        runner.shutdown()


async def test_a_failing_inbox_callback_does_not_strand_the_ones_after_it() -> None:
    inbox = LoopInbox(asyncio.get_running_loop())
    ran: list[str] = []
    inbox.post(lambda: 1 / 0)
    inbox.post_and_wake(ran.append, "after")
    for _ in range(300):
        if ran:
            break
        await asyncio.sleep(0.01)
    assert ran == ["after"]
