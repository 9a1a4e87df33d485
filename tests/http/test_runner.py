"""``app.runner.EngineRunner.write_durable`` without an engine: how the two futures settle."""
from __future__ import annotations

import pytest

from app.problems import INVALID_INPUT, Problem


async def test_write_durable_settles_once_both_are_done() -> None:
    """``runner.write_durable``: the result once the persist future is done; its error, the call's
    error, or a cancelled persist future reach the caller (never a hang)."""
    import concurrent.futures

    from app.runner import EngineRunner

    runner = EngineRunner(engine=None)  # type: ignore[arg-type]
    try:
        assert await runner.write_durable(lambda: (1, None)) == 1
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        assert await runner.write_durable(lambda: (2, done)) == 2
        failed: concurrent.futures.Future[None] = concurrent.futures.Future()
        failed.set_exception(OSError("disk"))
        with pytest.raises(OSError):
            await runner.write_durable(lambda: (3, failed))
        cancelled: concurrent.futures.Future[None] = concurrent.futures.Future()
        cancelled.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            await runner.write_durable(lambda: (4, cancelled))

        def boom() -> tuple[int, None]:
            raise Problem(INVALID_INPUT, "bad", field="body")
        with pytest.raises(Problem):
            await runner.write_durable(boom)
    finally:
        runner.shutdown()
