"""A partition's in-memory write queue: an immutable, seqno-ordered vector of Items.

Why a ``pvector`` and not a sorted map: seqnos are dense (every accepted write takes the
next one), so "ordered by seqno" is just "indexed by ``seqno - base``".  Appending through a
pyrsistent evolver is cheap and a deduplication (the key's older queued version is dropped) is
one evolver ``set`` of the old slot to ``None``, while ``pmap.set`` would cost two orders of
magnitude more per write (see docs/benchmarks.md, Engine: ingest).  Each write batch ends with one ``persistent()`` call that publishes a new
``QueueRoot``; a snapshot is that root (O(1)), it never changes, and unshared subtrees are
freed when the last snapshot holding an old root goes away.

The queue also keeps, for the writer only, ``index``: key -> latest queued Item, used for
deduplication and for CAS/rev checks without touching LMDB.  Everything that mutates the
queue (writes, the flusher's "persisted up to" step, rebasing) runs under the engine's
writer lock; readers only ever take ``root`` (one attribute read, atomic under the GIL).

Rebase: items stay in the vector after they are persisted (snapshots taken before the
flush may still read them from memory).  When the persisted prefix is at least half of the
vector, the vector is sliced so that prefix can be freed.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import compress
from operator import is_, itemgetter
from typing import NamedTuple

from pyrsistent import PVector, pvector

from engine.core.types import Item
from engine.gc_untrack import untrack

#: Python object overhead counted per queued item for backpressure (tuple, ints, bytes headers).
ITEM_OVERHEAD = 200
_REBASE_MIN = 1024
# Every vector the queue publishes holds only Items and None: it cannot be part of a cycle, and
# left tracked the cyclic GC would walk all its slots on every collection it is examined in.
_EMPTY: PVector = untrack(pvector())
_key_of = itemgetter(0)  # Item.key
_value_of = itemgetter(5)  # Item.value


class QueueRoot(NamedTuple):
    """An immutable view of the queue: ``vec[i]`` holds seqno ``base + i`` (None if deduplicated).

    ``persisted`` is the queue's persisted seqno when the root was published.  Only slots above
    it are guaranteed deduplicated: once a flush has dropped a key from the index, a rewrite
    can no longer clear the key's (persisted) slot.  Readers therefore never read a root's
    slots at or below its ``persisted``.
    """

    vec: PVector
    base: int
    high: int
    persisted: int

    def items(self, start: int, end: int) -> Iterator[Item]:
        """Queued items with ``start <= seqno <= end`` in seqno order, skipping dropped slots."""
        lo = max(start, self.base) - self.base
        hi = min(end, self.high) - self.base + 1
        if hi <= lo:
            return iter(())
        # slicing the pvector (C, O(log n) to the start) rather than islice, which would step
        # over the first ``lo`` slots one by one on every call
        return filter(None, self.vec[lo:hi])


def item_cost(item: Item) -> int:
    return len(item.key) + len(item.value) + ITEM_OVERHEAD


class QueueBytes:
    """The bytes a set of queues (an engine's partitions) hold, kept as they change.

    WHY: the backpressure check runs before every write batch and would otherwise sum every
    partition's count (docs/benchmarks.md, Peers, "A node's CPU per small write request").
    Each queue adds its own change where it makes one: once per published batch (``QueueBatch``
    notes the queue's count when it begins) and in ``mark_persisted``/``reset``, all under the
    engine's writer lock, so the total equals the sum of the queues' ``bytes`` whenever no batch
    is being applied."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class QueueBatch:
    """Accumulates one write batch for one partition; ``publish`` makes it visible at once.

    Appending is ``engine.batch_writer``'s: it is this class's declared friend and writes the
    append steps (evolver slot, index, byte count, ``next_seqno``) out in its per-write loop."""

    __slots__ = ("queue", "ev", "base", "next_seqno", "index", "bytes_before")

    def __init__(self, queue: "WriteQueue") -> None:
        self.queue = queue
        root = queue.root
        self.ev = root.vec.evolver()
        self.base = root.base
        self.next_seqno = root.high + 1
        self.index = queue.index
        self.bytes_before = queue.bytes

    def publish(self) -> None:
        queue = self.queue
        queue.root = QueueRoot(untrack(self.ev.persistent()), self.base, self.next_seqno - 1, queue.persisted)
        queue.total.bytes += queue.bytes - self.bytes_before
        self.bytes_before = queue.bytes


class WriteQueue:
    """One partition's queue (see module docstring for the ownership rules)."""

    __slots__ = ("root", "persisted", "index", "bytes", "total")

    def __init__(self, persisted_seqno: int) -> None:
        self.root = QueueRoot(_EMPTY, persisted_seqno + 1, persisted_seqno, persisted_seqno)
        self.persisted = persisted_seqno
        self.index: dict[bytes, Item] = {}
        self.bytes = 0
        #: the total this queue's count is part of (its own until ``count_in``)
        self.total = QueueBytes()

    def count_in(self, total: QueueBytes) -> None:
        """Keep this queue's bytes in ``total`` from now on (under the writer lock)."""
        self.total.bytes -= self.bytes
        total.bytes += self.bytes
        self.total = total

    @property
    def high(self) -> int:
        return self.root.high

    @property
    def depth(self) -> int:
        """Queued versions not yet persisted (deduplicated slots not counted)."""
        return len(self.index)

    def begin(self) -> QueueBatch:
        return QueueBatch(self)

    def unpersisted(self, limit: int) -> tuple[list[Item], int]:
        """Items after the persisted seqno (at most ``limit`` seqnos) and the last seqno covered."""
        root = self.root
        start = self.persisted + 1
        end = min(root.high, self.persisted + limit)
        if end < start:
            return [], self.persisted
        lo = start - root.base
        return list(filter(None, root.vec[lo:lo + end - start + 1])), end

    def mark_persisted(self, items: list[Item], upto: int) -> QueueRoot | None:
        """Forget what a flush persisted, unless a newer version superseded it meanwhile.

        Must run under the writer lock, after the flush transaction committed (a writer that
        misses ``index`` falls back to LMDB and must find the item there).  Returns the root
        replaced by a rebase, so the caller can drop it (and free its items) outside the lock.
        """
        index = self.index
        root = self.root
        before = self.bytes
        if upto >= root.high:
            # everything queued is persisted (the usual case when the flusher keeps up)
            index.clear()
            self.bytes = 0
        elif root.high - upto < len(items):
            # fewer writes arrived during the flush than it persisted: rebuild the index from
            # them.  Invariant: the index holds exactly the latest version of every key queued
            # above the persisted seqno, which are exactly the non-empty slots above it (a
            # rewrite empties its key's older slot while that is above the persisted seqno).
            tail = list(filter(None, root.vec[upto + 1 - root.base:]))
            keys = list(map(_key_of, tail))
            self.index = dict(zip(keys, tail))
            self.bytes = sum(map(len, keys)) + sum(map(len, map(_value_of, tail))) + ITEM_OVERHEAD * len(tail)
        else:
            # C-level passes, no bytecode per flushed item: the items whose key still maps to
            # them were not superseded; a flush holds each key at most once
            keys = list(map(_key_of, items))
            done = list(compress(items, map(is_, map(index.get, keys), items)))
            done_keys = list(map(_key_of, done))
            deque(map(index.__delitem__, done_keys), 0)
            self.bytes -= (sum(map(len, done_keys)) + sum(map(len, map(_value_of, done)))
                           + ITEM_OVERHEAD * len(done))
        self.total.bytes += self.bytes - before
        if upto > self.persisted:
            self.persisted = upto
        return self._maybe_rebase()

    def _maybe_rebase(self) -> QueueRoot | None:
        """Publish a root carrying the new persisted seqno, slicing off the persisted prefix
        when it is large (returns the replaced root if that freed anything)."""
        root = self.root
        persisted = self.persisted
        prefix = persisted - root.base + 1
        size = len(root.vec)
        if prefix >= size:
            self.root = QueueRoot(_EMPTY, persisted + 1, root.high, persisted)
        elif prefix >= _REBASE_MIN and prefix * 2 >= size:
            self.root = QueueRoot(untrack(root.vec[prefix:]), persisted + 1, root.high, persisted)
        else:
            self.root = root._replace(persisted=persisted)
            return None
        return root

    def reset(self, seqno: int) -> None:
        """Start empty at ``seqno`` (used at open)."""
        self.root = QueueRoot(_EMPTY, seqno + 1, seqno, seqno)
        self.persisted = seqno
        self.index.clear()
        self.total.bytes -= self.bytes
        self.bytes = 0
