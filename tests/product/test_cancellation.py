"""A task that is cancelled stops: product code never waits with ``asyncio.wait_for``.

On Python 3.11 ``wait_for`` returns the inner result and drops a cancel that arrives after the
inner wait finished but before ``wait_for`` resumed (fixed in 3.12).  A loop such as the
orchestrator's (``await wait_for(changed.wait(), tick)`` while watch events set ``changed`` many
times a second) then keeps running after ``ClusterNode.stop`` cancelled it once, and the node's
shutdown waits for it for ever.  ``asyncio.timeout`` runs the wait in the task itself, so the
cancel always reaches it."""
from __future__ import annotations

import ast
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("app", "engine", "clients", "spark_connector")


def _looping(wait) -> asyncio.Task:  # type: ignore[no-untyped-def]
    async def loop(changed: asyncio.Event) -> None:
        while True:
            changed.clear()
            await wait(changed)

    changed = asyncio.Event()
    task = asyncio.get_running_loop().create_task(loop(changed))
    task.changed = changed  # type: ignore[attr-defined]
    return task


async def _cancel_right_after_a_set(task: asyncio.Task) -> bool:
    """Whether ``task`` ended after one cancel sent just after its event was set."""
    await asyncio.sleep(0)
    task.changed.set()  # type: ignore[attr-defined]
    await asyncio.sleep(0)   # the inner wait completes; the outer wait has not resumed yet
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.5)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    return bool(done)


def test_a_timeout_block_never_drops_the_cancel() -> None:
    async def with_timeout(changed: asyncio.Event) -> None:
        try:
            async with asyncio.timeout(5):
                await changed.wait()
        except TimeoutError:
            pass

    async def main() -> bool:
        return await _cancel_right_after_a_set(_looping(with_timeout))

    assert asyncio.run(main())


def test_wait_for_drops_that_cancel_on_this_python() -> None:
    """Why the rule below exists (on 3.12 and later ``wait_for`` is built on ``timeout``)."""
    async def with_wait_for(changed: asyncio.Event) -> None:
        try:
            await asyncio.wait_for(changed.wait(), 5)
        except TimeoutError:
            pass

    async def main() -> bool:
        return await _cancel_right_after_a_set(_looping(with_wait_for))

    assert asyncio.run(main()) is (sys.version_info >= (3, 12))


def test_product_code_does_not_use_wait_for() -> None:
    offenders = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if (isinstance(node, ast.Attribute) and node.attr == "wait_for"
                        and isinstance(node.value, ast.Name) and node.value.id == "asyncio"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"asyncio.wait_for can drop a cancel on Python 3.11; use asyncio.timeout: {offenders}"
