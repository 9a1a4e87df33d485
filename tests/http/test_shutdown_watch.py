"""A shutdown that runs past its watch logs where every pending task is, once; one that ends in
time logs nothing."""
from __future__ import annotations

import asyncio
import logging

import pytest

from app.shutdown_watch import ShutdownWatch


async def _stuck_step() -> None:
    await asyncio.sleep(30)


def test_a_slow_shutdown_logs_each_pending_task_stack(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        stuck = asyncio.create_task(_stuck_step(), name="a stuck step")
        watch = ShutdownWatch(after_s=0.05)
        watch.arm()
        await asyncio.sleep(0.2)
        watch.disarm()
        stuck.cancel()

    with caplog.at_level(logging.WARNING, logger="upr.server"):
        asyncio.run(main())
    dumps = [r.getMessage() for r in caplog.records if "shutdown still running" in r.getMessage()]
    assert len(dumps) == 1 and "_stuck_step" in dumps[0] and "a stuck step" in dumps[0]


def test_a_shutdown_in_time_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        watch = ShutdownWatch(after_s=0.1)
        watch.arm()
        watch.disarm()
        await asyncio.sleep(0.2)

    with caplog.at_level(logging.WARNING, logger="upr.server"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "shutdown still running" in r.getMessage()]
