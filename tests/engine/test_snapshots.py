"""Snapshots stay unchanged while writes, flushes and rebases go on; structural sharing."""
from __future__ import annotations

import gc
import tracemalloc

from engine.batch_writer import BatchWriter
from engine.core.types import Op, PartitionState, WriteOp, WriteResult
from engine.flusher import lmdb_turn
from engine.partition import Partition
from engine.snapshot import capture
from engine.storage.store import Store
from engine.writequeue import QueueRoot, WriteQueue

SLOW_FLUSH = {"flush_interval_ms": 60_000.0}


def put(key, value=b"v") -> WriteOp:
    return WriteOp(Op.MUTATION, key, value)


def content(snapshot):
    return [[(p.source, p.start, p.end)] + [(i.key, i.seqno, i.value) for b in p.batches(max_items=7) for i in b]
            for p in snapshot.parts]


def test_memory_snapshot_unchanged_by_later_writes_flushes_and_rebase(make_engine) -> None:
    engine = make_engine(partitions=1, **SLOW_FLUSH)
    engine.write_batch([put(f"k{i}", b"old") for i in range(3000)])
    snap = engine.snapshot(0, 0)
    twin = engine.snapshot(0, 0)
    expected = content(twin)
    assert expected[0][0] == ("memory", 1, 3000) and len(expected[0]) == 3001
    engine.write_batch([put(f"k{i}", b"new") for i in range(0, 3000, 2)])  # dedup in the live queue
    engine.flush_now()  # persists, drops, and rebases the queue
    assert engine._parts[0].queue.root.base == 4501
    engine.write_batch([put(f"x{i}") for i in range(10)])
    assert content(snap) == expected


def test_disk_snapshot_unchanged_by_later_rewrites(make_engine) -> None:
    engine = make_engine(partitions=1)
    engine.write_batch([put(f"k{i}", b"old") for i in range(500)])
    engine.flush_now()
    snap = engine.snapshot(0, 100)
    assert [(p.source, p.start, p.end) for p in snap.parts] == [("disk", 101, 500)]
    engine.write_batch([put(f"k{i}", b"new") for i in range(500)])  # moves every key to a new seqno
    engine.flush_now()
    items = list(snap.items())
    assert [(i.seqno, i.value) for i in items] == [(s, b"old") for s in range(101, 501)]
    fresh = list(engine.snapshot(0, 100).items())
    assert [(i.seqno, i.value) for i in fresh] == [(s, b"new") for s in range(501, 1001)]


def test_snapshot_batches_respect_items_and_bytes(make_engine) -> None:
    engine = make_engine(partitions=1, **SLOW_FLUSH)
    engine.write_batch([put(f"k{i}", b"x" * 100) for i in range(50)])
    engine.flush_now()
    engine.write_batch([put(f"m{i}", b"x" * 100) for i in range(50)])
    for part in engine.snapshot(0, 0).parts:
        sizes = [len(b) for b in part.batches(max_items=1000, max_bytes=1000)]
        assert sizes == [10] * 5
        assert [len(b) for b in engine.snapshot(0, 0).parts[0].batches(max_items=8)] == [8] * 6 + [2]


def test_snapshot_retries_when_the_root_is_ahead_of_the_read_txn(make_engine) -> None:
    engine = make_engine(partitions=1, **SLOW_FLUSH)
    engine.write_batch([put(f"k{i}") for i in range(10)])
    engine.flush_now()
    engine.write_batch([put(f"m{i}") for i in range(5)])
    queue = engine._parts[0].queue
    rebased_too_far = QueueRoot(queue.root.vec, 99, 99, 98)
    roots = iter([rebased_too_far, queue.root])
    calls = []

    def root_of() -> QueueRoot:
        calls.append(1)
        return next(roots)

    snap = capture(engine._store, 0, root_of, 0, 0)
    assert len(calls) == 2
    assert [(p.source, p.start, p.end) for p in snap.parts] == [("disk", 1, 10), ("memory", 11, 15)]
    assert [i.seqno for i in snap.items()] == list(range(1, 16))


def test_closing_a_snapshot_releases_its_read_txn(make_engine) -> None:
    engine = make_engine(partitions=1)
    engine.write_batch([put(f"k{i}") for i in range(10)])
    engine.flush_now()
    gate = engine._store._gate
    snaps = [engine.snapshot(0, 0) for _ in range(5)]
    assert gate._readers == 5
    for s in snaps:
        s.close()
    assert gate._readers == 0
    with engine.snapshot(0, 0) as s:
        assert len(list(s.items())) == 10
    assert gate._readers == 0


def _fill(writer: BatchWriter, count: int, start: int = 0) -> None:
    """One batch through the production write path (keys new or rewritten in the queue)."""
    results, _ = writer.write([(Op.MUTATION, f"k{i}", b"v", None) for i in range(start, start + count)])
    assert all(isinstance(r, WriteResult) for r in results)


def test_structural_sharing_100_snapshots_cost_little_more_than_one(tmp_path) -> None:
    store = Store.open(tmp_path / "data", 1, 1 << 24, 25).store
    queue = WriteQueue(0)
    part = Partition(id=0, state=PartitionState.ACTIVE, failover_log=(), purge_seqno=0, live_items=0,
                     persisted_live=0, queue=queue)
    writer = BatchWriter([part], store, lmdb_turn(), max_key_bytes=250, max_value_bytes=1 << 20)
    gc.collect()
    tracemalloc.start()
    try:
        for chunk in range(100):
            _fill(writer, 1000, chunk * 1000)
        one_queue = tracemalloc.get_traced_memory()[0]
        snaps = [queue.root]
        for i in range(100):  # each snapshot differs: 10 new writes and 10 rewrites between them
            _fill(writer, 10, 300_000 + i * 10)
            _fill(writer, 10, i * 10)
            snaps.append(queue.root)
        hundred = tracemalloc.get_traced_memory()[0] - one_queue
    finally:
        tracemalloc.stop()
        store.close()
    print(f"queue of 100k items: {one_queue} B; 100 more snapshots: {hundred} B")
    # 100 roots (plus the 2,000 items written between them) cost under 5% of one queue
    assert hundred < 0.05 * one_queue, (hundred, one_queue)
    assert snaps[0].vec[0] is not None and queue.root.vec[0] is None  # old roots unchanged
    assert [s.high for s in snaps[:3]] == [100_000, 100_020, 100_040]
    assert [len(list(s.items(1, s.high))) for s in (snaps[0], snaps[-1])] == [100_000, 101_000]
