"""The replica applier: a replicated snapshot's items into a replica partition's write queue.

A replica copy must end equal to its active, byte for byte: every item keeps the seqno, CAS, rev
and deleted flag the active gave it, so a consumer, or the replica itself once promoted, cannot
tell the copy from the original.  The items take the same path as client writes (write queue,
then the flusher), so snapshots, persistence and crash recovery work unchanged.

Seqnos on a replica are not dense: the active deduplicates, so a snapshot ``(start, end)`` may
hold a handful of the seqnos in its range.  The queue is indexed by seqno, so the skipped seqnos
become empty slots, like deduplicated ones; when a snapshot is whole its end becomes the high
seqno even when its last items were deduplicated away, so "holds up to ``end``" and
"high seqno" agree.

Like ``engine.batch_writer`` this module is a declared friend of ``engine.writequeue``'s
``QueueBatch`` (it appends through the evolver); it runs under the engine's writer lock, and
its LMDB lookups under ``lmdb_turn``.  On a busy active's replicas it is a hot path: a run of
received steps is applied under one lock, one turn and one read transaction
(``Engine.apply_replica_run``).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any, NamedTuple

from engine.core.errors import InvalidInput
from engine.core.types import Item
from engine.partition import Partition
from engine.storage.records import META
from engine.storage.store import Store
from engine.writequeue import ITEM_OVERHEAD, QueueBatch


class MarkerStep(NamedTuple):
    """A replicated snapshot ``(start, end)`` of ``partition`` begins."""

    partition: int
    start: int
    end: int


class ItemsStep(NamedTuple):
    """Replicated ``items`` of ``partition``'s current snapshot; ``last``: the snapshot is whole."""

    partition: int
    items: Sequence[Item]
    last: bool


#: what ``Engine.apply_replica_run`` applies, in order
ReplicaStep = MarkerStep | ItemsStep


class ByKeyReader:
    """The persisted by-key records a run of replicated items looks up, through one LMDB read
    transaction opened on first use (most runs of new keys need none: see ``append_items``)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._read: Any = None
        self._txn: Any = None

    def existed(self, partition: int, raw: bytes) -> bool:
        """Whether the persisted record of ``raw`` is a live document."""
        if self._txn is None:
            self._read = self._store.read_txn()
            self._txn = self._read.__enter__()
        meta = self._txn.get(raw, None, self._store.key_dbs[partition])
        return meta is not None and not META.unpack(meta)[3]

    def close(self) -> None:
        if self._read is not None:
            self._read.__exit__(None, None, None)
            self._read = self._txn = None


def reads_persisted_records(steps: Sequence[ReplicaStep], part_of: Callable[[int], Partition]) -> bool:
    """Whether applying ``steps`` would look up a persisted by-key record (``ByKeyReader``): an
    item of rev above 1 whose key neither its partition's queue index nor an earlier item of
    the steps holds (see ``append_items``).  WHY: the event loop applies small runs itself
    (``Engine.try_apply_replica_run``) but never reads LMDB; such a run goes to a thread.
    Called under the writer lock, so the queue indexes do not move meanwhile."""
    seen: set[tuple[int, bytes]] = set()
    for step in steps:
        if type(step) is not ItemsStep:
            continue
        index = part_of(step.partition).queue.index
        for item in step.items:
            key = item.key
            if item.rev != 1 and key not in index and (step.partition, key) not in seen:
                return True
            seen.add((step.partition, key))
    return False


def apply_items(part: Partition, store: Store, turn: threading.Lock, items: Iterable[Item], *,
                last: bool) -> int:
    """Append ``items`` (ascending seqnos inside the current snapshot, above the high seqno) to
    ``part``'s queue; with ``last`` the snapshot is whole and the high seqno moves to its end.

    Returns the highest CAS applied (0 if none).  Validates every item before changing anything,
    so a bad batch leaves the partition as it was."""
    reader = ByKeyReader(store)
    try:
        with turn:
            return append_items(part, reader, items, last=last)
    finally:
        reader.close()


def append_items(part: Partition, reader: ByKeyReader, items: Iterable[Item], *, last: bool) -> int:
    """``apply_items`` for a caller that holds the LMDB turn and owns ``reader``.

    Whether each key held a live document before (the partition's live item count) comes from
    the queue index, else from the persisted record, except for an item of rev 1: the active
    gives rev 1 only to a key it holds no record of, not even a tombstone, and the copy holds
    the active's history, so such a key is not live here either and needs no lookup."""
    current = part.snapshots.current
    if current is None:
        raise InvalidInput(f"partition {part.id}: replicated items arrived before any snapshot marker",
                           partition=part.id, field="snapshot")
    start, end = current
    batch_items = list(items)
    prev_seqno = part.high_seqno
    for item in batch_items:
        if type(item.key) is not bytes or not item.key:
            raise InvalidInput(f"partition {part.id}: replicated item with an empty or non-bytes key",
                               partition=part.id, seqno=item.seqno, field="key")
        if not (prev_seqno < item.seqno <= end and item.seqno >= start):
            raise InvalidInput(
                f"partition {part.id}: replicated seqno {item.seqno} is outside the snapshot ({start}, {end}) "
                f"or not above the previous seqno {prev_seqno}", partition=part.id, seqno=item.seqno, field="seqno")
        prev_seqno = item.seqno
    queue = part.queue
    batch = queue.begin()
    max_cas = 0
    try:
        for item in batch_items:
            raw = item.key
            prev = batch.index.get(raw)
            if prev is not None:
                existed = not prev.deleted
            else:
                existed = item.rev != 1 and reader.existed(part.id, raw)
            _fill_to(batch, item.seqno - 1)
            if prev is not None:
                if prev.seqno > queue.persisted:
                    batch.ev[prev.seqno - batch.base] = None
                queue.bytes -= len(raw) + len(prev.value) + ITEM_OVERHEAD
            stored = Item(raw, item.seqno, item.cas, item.rev, bool(item.deleted),
                          b"" if item.deleted else bytes(item.value))
            batch.ev.append(stored)
            batch.index[raw] = stored
            queue.bytes += len(raw) + len(stored.value) + ITEM_OVERHEAD
            batch.next_seqno = item.seqno + 1
            if stored.deleted and existed:
                part.live_items -= 1
            elif not stored.deleted and not existed:
                part.live_items += 1
            if item.cas > max_cas:
                max_cas = item.cas
        if last:
            _fill_to(batch, end)
    finally:
        batch.publish()
    return max_cas


def _fill_to(batch: QueueBatch, seqno: int) -> None:
    """Empty slots up to ``seqno``: seqnos the active deduplicated out of the snapshot."""
    gap = seqno - batch.next_seqno + 1
    if gap > 0:
        batch.ev.extend(repeat(None, gap))
        batch.next_seqno = seqno + 1
