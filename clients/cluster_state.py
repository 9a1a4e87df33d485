"""A cluster consumer's one saved state, shared by its node streams (positions do not depend on the node).

Every node stream saves into one ``PartitionStates`` (one state file, per partition checkpoints,
no node id), so a partition that moves resumes on its new node from its processed checkpoint.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from engine.protocol.client.checkpoint import ConsumerState, PartitionCheckpoint

from .state import StateStore

__all__ = ["PartitionStates"]

log = logging.getLogger("upr.client")


class PartitionStates:
    """The consumer's one state, per partition, written by every node stream (see the module
    docstring); ``view(partitions)`` is the ``StateStore`` a node stream reads and writes.

    Writes to the store are coalesced to one per ``interval`` (after syncing the shared ring, so
    the state never claims items the ring could have lost): each write fsyncs on the event loop,
    and several node streams saving on their own would multiply those stalls.  The store only
    lags, never runs ahead of what was processed, so a crash resumes earlier, never later."""

    def __init__(self, store: StateStore, loaded: ConsumerState | None, ring: Any = None,
                 interval: float = 1.0) -> None:
        self.store = store
        self.ring = ring
        self.interval = interval
        self.parts: dict[int, PartitionCheckpoint] = dict(loaded.partitions) if loaded is not None else {}
        self.partition_count = loaded.partition_count if loaded is not None else None
        self._last_write = 0.0
        self._dirty = False
        self._timer: asyncio.TimerHandle | None = None

    def put(self, partition: int, checkpoint: PartitionCheckpoint) -> None:
        self.parts[partition] = checkpoint
        self.changed()

    def changed(self) -> None:
        """Some checkpoint moved: write now if the last write is ``interval`` old, else soon."""
        self._dirty = True
        wait = self.interval - (time.monotonic() - self._last_write)
        if wait <= 0:
            self.save()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(wait, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._dirty:
            try:
                self.save()
            except Exception:  # the next write retries; a timer callback has nobody to raise to
                log.exception("saving the consumer's positions failed")

    def save(self) -> None:
        """Write now (after syncing the ring)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.ring is not None:
            self.ring.sync()
        self.store.save(ConsumerState(dict(self.parts), None, self.partition_count))
        self._last_write = time.monotonic()
        self._dirty = False

    def view(self, partitions: Iterable[int]) -> "_StateView":
        return _StateView(self, set(partitions))


class _StateView:
    """A node stream's window on ``PartitionStates``: it reads and writes only its partitions."""

    def __init__(self, states: PartitionStates, partitions: set[int]) -> None:
        self.states = states
        self.partitions = partitions

    def load(self) -> ConsumerState | None:
        parts = {p: c for p, c in self.states.parts.items() if p in self.partitions}
        return ConsumerState(parts, None, self.states.partition_count)

    def save(self, state: ConsumerState) -> None:
        for p, cp in state.partitions.items():
            if p in self.partitions:
                self.states.parts[p] = cp
        if state.partition_count is not None:
            self.states.partition_count = state.partition_count
        self.states.changed()
