"""The batch writer: the per-write path of ``Engine.write_batch``, the engine's hottest loop.

A write's life here: validated (nothing changes on a bad item), assigned the partition's next
seqno, a CAS (monotonic hybrid of the batch's clock reading) and ``rev = previous rev + 1``
(previous version from the queue index, else one by-key lookup in LMDB), then appended to the
partition's ``QueueBatch``.  The batches are published (made visible to snapshots) when the
loop ends, even when it ends by an exception, so what was queued and what readers see agree.

WHY one module that is the declared friend of ``engine.writequeue`` and ``engine.storage``
internals: per write, a method call or an attribute chain costs a measurable share of the loop
(``bench.bench_engine``, ingest), so the queue append (``QueueBatch``'s evolver, index and byte
count) and the by-key lookup (``Store.key_dbs`` and the ``records.META`` format) are written out
here, once, instead of as calls.  They exist nowhere else: the write-queue model test
(tests/engine/test_writequeue_model.py) drives this class, so a regression here fails it.

Threads: ``write`` runs under the engine's writer lock (the caller's); it holds the
``lmdb_turn`` lock for the loop, because the loop's by-key lookups are a run of short LMDB
calls (``engine.flusher.lmdb_turn`` says why).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from engine.core.errors import (
    CasMismatch,
    InvalidInput,
    InvalidKey,
    KeyNotFound,
    PartitionNotActive,
    TooLarge,
    UprError,
)
from engine.core.keys import encode_key, partition_for_key
from engine.core.types import Item, Op, PartitionState, WriteResult
from engine.partition import Partition
from engine.storage.records import META
from engine.storage.store import Store
from engine.writequeue import ITEM_OVERHEAD, QueueBatch

_tuple_new = tuple.__new__
_ACTIVE = PartitionState.ACTIVE
_MUTATION = Op.MUTATION
_DELETION = Op.DELETION


class BatchWriter:
    """Queues write batches into the partitions' write queues (see the module docstring)."""

    __slots__ = ("_parts", "_store", "_turn", "_max_key", "_max_value", "last_cas", "writes_total",
                 "write_errors_total")

    def __init__(self, parts: Sequence[Partition], store: Store, turn: threading.Lock, *, max_key_bytes: int,
                 max_value_bytes: int, last_cas: int = 0) -> None:
        self._parts = parts
        self._store = store
        self._turn = turn
        self._max_key = max_key_bytes
        self._max_value = max_value_bytes
        #: The highest CAS handed out: the next one is above it even if the clock steps back.
        self.last_cas = last_cas
        self.writes_total = 0
        self.write_errors_total = 0

    def write(self, ops: Sequence[tuple[Op, str, bytes, int | None]],
              clock: int | None = None) -> tuple[list[WriteResult | UprError], list[int]]:
        """Queue ``ops`` in order; returns the per-item results and the partitions written.

        ``clock`` is the batch's one clock reading (``time.time_ns()`` when None): CAS =
        max(previous + 1, clock), so CAS strictly increases and stays within a batch's duration
        of the wall clock.  The caller holds the engine's writer lock.
        """
        parts = self._parts
        store = self._store
        results: list[WriteResult | UprError] = []
        add_result = results.append
        batches: dict[int, QueueBatch] = {}
        n = len(parts)
        max_key = self._max_key
        max_value = self._max_value
        new = _tuple_new
        errors = 0
        read = None
        txn = None
        lmdb_get = None
        key_dbs = store.key_dbs
        unpack_meta = META.unpack
        overhead = ITEM_OVERHEAD
        partition_of = partition_for_key
        cas_floor = self.last_cas
        if clock is None:
            clock = time.time_ns()
        turn = self._turn
        turn.acquire()
        try:
            for op in ops:
                try:
                    kind, key, value, want = op  # a WriteOp is a named tuple: one unpack
                    if type(key) is not str:
                        raise InvalidKey("key must be a string", field="key")
                    try:
                        raw = key.encode()
                    except UnicodeEncodeError:
                        raise InvalidKey("key is not valid UTF-8 (lone surrogate)", field="key") from None
                    if not raw or len(raw) > max_key:
                        encode_key(key, max_key)  # raises the precise InvalidKey
                    if kind == _MUTATION:
                        if type(value) is not bytes:
                            if not isinstance(value, (bytes, bytearray, memoryview)):
                                raise InvalidInput("value must be bytes", field="value")
                            value = bytes(value)
                        if len(value) > max_value:
                            raise TooLarge(f"value is {len(value)} bytes; the limit is {max_value}", field="value")
                        deleted = False
                    elif kind == _DELETION:
                        value = b""
                        deleted = True
                    else:
                        raise InvalidInput(f"unknown op {kind!r}", field="op")
                    p = partition_of(raw, n)
                    part = parts[p]
                    if part.state is not _ACTIVE or part.writes_stopped:
                        raise PartitionNotActive(f"partition {p} is {_refusal(part)}", partition=p)
                    queue = part.queue
                    # the previous version: the queue index, else the persisted by-key record
                    prev = queue.index.get(raw)
                    if prev is not None:
                        _k, _s, prev_cas, prev_rev, was_deleted, _v = prev
                        exists = not was_deleted
                    else:
                        if txn is None:
                            read = store.read_txn()
                            txn = read.__enter__()
                            lmdb_get = txn.get
                        meta = lmdb_get(raw, None, key_dbs[p])
                        if meta is None:
                            prev_cas = prev_rev = 0
                            exists = False
                        else:
                            _s, prev_cas, prev_rev, was_deleted = unpack_meta(meta)
                            exists = not was_deleted
                    if want and (not exists or want != prev_cas):
                        raise CasMismatch(
                            f"CAS {want} does not match the current CAS",
                            expected=want, actual=prev_cas if exists else 0, field="cas", partition=p,
                        )
                    if deleted and not exists:
                        raise KeyNotFound(f"no live document for key {key!r}", partition=p)
                    batch = batches.get(p)
                    if batch is None:
                        batch = batches[p] = queue.begin()
                    seqno = batch.next_seqno
                    cas = cas_floor + 1
                    if clock > cas:
                        cas = clock
                    cas_floor = cas
                    rev = prev_rev + 1
                    item = new(Item, (raw, seqno, cas, rev, deleted, value))
                    # the queue append: the key's older queued slot is dropped (deduplication)
                    # while it is above the persisted seqno (see ``QueueRoot``)
                    if prev is not None:
                        if prev.seqno > queue.persisted:
                            batch.ev[prev.seqno - batch.base] = None
                        queue.bytes -= len(raw) + len(prev.value) + overhead
                    batch.ev.append(item)
                    batch.index[raw] = item
                    queue.bytes += len(raw) + len(value) + overhead
                    batch.next_seqno = seqno + 1
                    if deleted:
                        part.live_items -= 1
                    elif not exists:
                        part.live_items += 1
                    add_result(new(WriteResult, (key, p, seqno, cas, rev, deleted)))
                except UprError as exc:
                    errors += 1
                    add_result(exc)
        finally:
            turn.release()
            if read is not None:
                read.__exit__(None, None, None)
            for batch in batches.values():
                batch.publish()
            self.last_cas = cas_floor
            self.writes_total += len(results) - errors
            self.write_errors_total += errors
        return results, list(batches)


def _refusal(part: Partition) -> str:
    return part.state.value if part.state is not _ACTIVE else "being handed over (writes stopped)"
