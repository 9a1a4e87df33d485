"""The backup driver takes a cluster consumer's news about moves as news, not as data.

A partition whose active changes mid-run comes back from ``Consumer.batches()`` as
``PartitionMoved`` (the node it asked was not active for it yet, e.g. a promoted replica that had
not taken over) or ``PartitionsUnavailable`` (no node serves it for a while); the consumer resumes
it on its own.  A backup must go on, not end with "unexpected event".
"""
from __future__ import annotations

import asyncio

import pytest

from clients.backup.driver import Driver
from clients.events import PartitionMoved, PartitionsUnavailable


class _Untouchable:
    """A partition writer that fails the test if the driver hands it anything."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the writer was called: {name}")


@pytest.mark.parametrize("event", [
    PartitionMoved(6, "not_my_partition", "n3", "partition 6 is replica, not active (map revision 2)"),
    PartitionMoved(6, "state_changed", "n1"),
    PartitionsUnavailable((0, 3, 6), "node n1 is down"),
], ids=["not_my_partition", "state_changed", "unavailable"])
def test_move_news_neither_fails_the_run_nor_reaches_a_writer(event: object) -> None:
    driver = object.__new__(Driver)  # the event dispatch alone: no archive, no server
    driver.writers = {p: _Untouchable() for p in (0, 3, 6)}  # type: ignore[assignment]
    remaining = {0, 3, 6}
    asyncio.run(driver._handle(None, event, remaining))  # type: ignore[arg-type]
    assert remaining == {0, 3, 6}
