"""Tail visits served on the event loop when they need nothing but the write queue's memory.

Theory of operation
-------------------
A consumer that keeps up asks, on every wake-up, for a few new items that are still in the
engine's write queue.  Taking that snapshot on a reader thread cost more than the work: one thread
hand-off there and one back (~0.1-0.4 ms each on this 2-core machine, more under load) plus an
LMDB read transaction per partition only to learn that the disk part is empty (measured with
``bench.bench_stream --only tail``: ~60 % of the notification -> frame time at 2,500 writes/s).

The memory part of a ``PartitionSnapshot`` is an immutable write-queue root: reading it is O(1)
and touches no LMDB.  ``memory_snapshot`` returns the same snapshot ``Engine.snapshot`` would,
*only* when no disk part can be needed, i.e. when the root's own persisted seqno is at or below
the position (``engine.snapshot.capture`` then yields exactly one memory part ``(after, high]``:
a root is deduplicated above its persisted seqno, and its slots start no later than
``persisted + 1``).  Otherwise it returns None and the visit goes to a reader thread as before.
The architecture's rule stands: no LMDB call ever runs on the event loop.

Bounded: the adapter serves a pass inline only when every visit of it is memory-only and the
items to encode are few (``StreamLimits.inline_items``); bigger tails keep the thread path so a
catching-up consumer never stalls the loop.

WHY reaching into the engine's partitions: the engine has no public "memory part only" call yet
(``engine/`` is not this module's to change); ``_root_of`` is the one place that does it.
"""
from __future__ import annotations

from typing import Any

from engine.snapshot import PartitionSnapshot, SnapshotPart, _MemoryReader

__all__ = ["memory_snapshot", "memory_backlog"]


def _partition_of(engine: Any, partition: int) -> Any:
    return engine._part(partition)  # noqa: SLF001 - see the module docstring


def memory_backlog(engine: Any, partition: int, after_seqno: int) -> int | None:
    """Items a snapshot after ``after_seqno`` would cover if it needs no disk part, else None."""
    root = _partition_of(engine, partition).queue.root
    if root.persisted > after_seqno or after_seqno + 1 < root.base:
        return None
    return max(0, root.high - after_seqno)


def memory_snapshot(engine: Any, partition: int, after_seqno: int) -> PartitionSnapshot | None:
    """``engine.snapshot(partition, after_seqno)`` when it has no disk part, taken without LMDB;
    None when a disk part may be needed (the caller then reads on a reader thread)."""
    part = _partition_of(engine, partition)
    root = part.queue.root  # one attribute read: an immutable, consistent view
    if root.persisted > after_seqno or after_seqno + 1 < root.base or after_seqno > root.high:
        return None
    parts: list[SnapshotPart] = []
    if root.high > after_seqno:
        start = after_seqno + 1
        parts.append(SnapshotPart("memory", start, root.high, _MemoryReader(root, start, root.high)))
    return PartitionSnapshot(partition, parts[-1].end if parts else after_seqno, part.purge_seqno, parts)
