"""Write path: dedup, CAS, bad input, partition states, backpressure, map growth."""
from __future__ import annotations

import pytest

from engine.core.errors import (
    Backpressure,
    CasMismatch,
    EngineClosed,
    InvalidInput,
    InvalidKey,
    InvalidPartition,
    KeyNotFound,
    PartitionNotActive,
    SeqnoRangeError,
    TooLarge,
    UprError,
)
from engine.core.types import FailoverEntry, Item, Op, PartitionState, WriteOp, WriteResult

SLOW_FLUSH = {"flush_interval_ms": 60_000.0}


def put(key, value=b"v", cas=None) -> WriteOp:
    return WriteOp(Op.MUTATION, key, value, cas)


def delete(key, cas=None) -> WriteOp:
    return WriteOp(Op.DELETION, key, b"", cas)


def state_of(engine):
    return [(s.high_seqno, s.item_count, s.queue_depth, s.queue_bytes) for s in engine.all_stats()]


def test_rewrite_while_queued_drops_the_old_slot(make_engine) -> None:
    engine = make_engine(partitions=1, **SLOW_FLUSH)
    engine.write_batch([put("a", b"1"), put("b", b"1"), put("a", b"2"), put("c", b"1"), put("a", b"3")])
    root = engine._parts[0].queue.root
    assert [None if i is None else (i.key, i.value) for i in root.vec] == [
        None, (b"b", b"1"), None, (b"c", b"1"), (b"a", b"3"),
    ]
    stats = engine.stats(0)
    assert (stats.high_seqno, stats.queue_depth, stats.item_count) == (5, 3, 3)
    items = list(engine.snapshot(0, 0).items())
    assert [(i.key, i.seqno, i.rev) for i in items] == [(b"b", 2, 1), (b"c", 4, 1), (b"a", 5, 3)]


def test_rewrite_of_a_persisted_key_leaves_one_by_seqno_entry(make_engine) -> None:
    engine = make_engine(partitions=1)
    for v in (b"1", b"2", b"3"):
        engine.write(put("a", v))
        engine.flush_now()
    engine.write(put("b"))
    engine.flush_now()
    snap = engine.snapshot(0, 0)
    assert [p.source for p in snap.parts] == ["disk"]
    assert [(i.key, i.seqno, i.value) for i in snap.items()] == [(b"a", 3, b"3"), (b"b", 4, b"v")]


def test_cas_match_and_mismatch(make_engine) -> None:
    engine = make_engine(partitions=2, **SLOW_FLUSH)
    first = engine.write(put("k", b"1"))
    second = engine.write(put("k", b"2", cas=first.cas))
    assert second.rev == 2
    before = state_of(engine)
    with pytest.raises(CasMismatch) as err:
        engine.write(put("k", b"3", cas=first.cas))
    assert (err.value.expected, err.value.actual) == (first.cas, second.cas)
    assert state_of(engine) == before and engine.get("k").value == b"2"
    engine.flush_now()  # the CAS check also works against the persisted version
    with pytest.raises(CasMismatch):
        engine.write(delete("k", cas=first.cas))
    assert engine.write(delete("k", cas=second.cas)).deleted
    with pytest.raises(CasMismatch) as err:
        engine.write(put("k", b"4", cas=second.cas))  # CAS against a deleted key
    assert err.value.actual == 0
    with pytest.raises(CasMismatch):
        engine.write(put("missing", b"1", cas=12345))


def test_delete_of_missing_key_is_key_not_found(engine) -> None:
    before = state_of(engine)
    with pytest.raises(KeyNotFound):
        engine.write(delete("nope"))
    assert state_of(engine) == before


@pytest.mark.parametrize(
    ("op", "error"),
    [
        (put("x" * 251), InvalidKey),
        (put(""), InvalidKey),
        (put("bad\ud800key"), InvalidKey),
        (WriteOp(Op.MUTATION, b"bytes-key", b"v"), InvalidKey),  # type: ignore[arg-type]
        (put("k", b"x" * 1001), TooLarge),
        (put("k", "text"), InvalidInput),  # type: ignore[arg-type]
        (WriteOp(7, "k", b"v"), InvalidInput),  # type: ignore[arg-type]
    ],
)
def test_bad_input_raises_typed_error_and_changes_nothing(make_engine, op, error) -> None:
    engine = make_engine(max_value_bytes=1000, **SLOW_FLUSH)
    engine.write(put("existing", b"1"))
    before = state_of(engine)
    with pytest.raises(error):
        engine.write(op)
    assert state_of(engine) == before
    results = engine.write_batch([put("a"), op, put("b")])
    assert isinstance(results[0], WriteResult) and isinstance(results[2], WriteResult)
    assert isinstance(results[1], error)
    assert sum(s.high_seqno for s in engine.all_stats()) == sum(b[0] for b in before) + 2
    assert engine.get("existing").value == b"1"


def test_key_of_exactly_250_bytes_is_accepted(engine) -> None:
    assert engine.write(put("é" * 125)).rev == 1


def test_non_active_partitions_reject_writes(make_engine) -> None:
    engine = make_engine(partitions=2, **SLOW_FLUSH)
    keys = {engine.partition_of(f"k{i}"): f"k{i}" for i in range(20)}
    for state in (PartitionState.REPLICA, PartitionState.PENDING, PartitionState.DEAD):
        engine.set_state(1, state)
        before = state_of(engine)
        with pytest.raises(PartitionNotActive) as err:
            engine.write(put(keys[1]))
        assert err.value.partition == 1 and err.value.retriable
        assert state_of(engine) == before
        assert isinstance(engine.write(put(keys[0])), WriteResult)
    engine.set_state(1, PartitionState.ACTIVE)
    assert engine.write(put(keys[1])).partition == 1


def test_partition_state_survives_restart(make_engine) -> None:
    engine = make_engine(partitions=2)
    engine.set_state(1, PartitionState.REPLICA)
    engine.close()
    again = make_engine(partitions=2)
    assert again.state(1) is PartitionState.REPLICA and again.state(0) is PartitionState.ACTIVE


@pytest.mark.parametrize("partition", [-1, 4, "0", None])
def test_bad_partition_ids(engine, partition) -> None:
    for call in (engine.stats, engine.failover_log, engine.high_seqno):
        with pytest.raises(InvalidPartition):
            call(partition)
    with pytest.raises(InvalidPartition):
        engine.snapshot(partition, 0)
    with pytest.raises(InvalidPartition):
        engine.set_state(partition, PartitionState.DEAD)
    with pytest.raises(InvalidPartition):
        engine.persist_future({partition: 0})


def test_seqno_range_errors(engine) -> None:
    r = engine.write(put("a"))
    with pytest.raises(SeqnoRangeError):
        engine.snapshot(r.partition, 2)
    with pytest.raises(SeqnoRangeError):
        engine.snapshot(r.partition, -1)
    with pytest.raises(SeqnoRangeError):
        engine.persist_future({r.partition: 2})


def test_backpressure_when_queue_over_limit_then_recovers(make_engine) -> None:
    engine = make_engine(queue_memory_limit_bytes=50_000, **SLOW_FLUSH)
    with pytest.raises(Backpressure) as err:
        for i in range(200):
            engine.write_batch([put(f"k{i}-{j}", b"x" * 100) for j in range(10)])
    assert err.value.retriable
    high = sum(s.high_seqno for s in engine.all_stats())
    assert high < 2000
    engine.flush_now()
    assert engine.engine_stats()["queue_bytes"] == 0
    assert isinstance(engine.write(put("after")), WriteResult)
    assert engine.engine_stats()["backpressure_total"] == 1


def test_the_byte_total_the_limit_reads_is_the_sum_of_the_queues(make_engine) -> None:
    """The backpressure check reads one running total: it must follow every way a queue's
    bytes change (writes, rewrites, deletes, a refused item, a replica's applies, a flush, a
    replica's reset)."""
    engine = make_engine(partitions=4, **SLOW_FLUSH)

    def agree() -> int:
        total = engine.engine_stats()["queue_bytes"]
        assert total == sum(s.queue_bytes for s in engine.all_stats())
        return int(total)

    keys = [k for k in (f"k{i}" for i in range(200)) if engine.partition_of(k) != 3][:40]
    engine.write_batch([put(k, b"x" * i) for i, k in enumerate(keys)])
    first = agree()
    assert first > 0
    results = engine.write_batch([put(k, b"y") for k in keys[::3]] + [delete(keys[1]), delete("never-written")])
    assert isinstance(results[-1], KeyNotFound)
    assert 0 < agree() < first
    engine.set_state(3, PartitionState.REPLICA)
    engine.adopt_failover_log(3, (FailoverEntry(77, 0),))
    engine.replica_marker(3, 1, 2)
    engine.apply_replicated(3, [Item(b"r1", 1, 5, 1, False, b"abc"), Item(b"r2", 2, 6, 1, False, b"de")], last=True)
    with_replica = agree()
    assert with_replica > 0
    engine.reset_partition(3)
    assert agree() < with_replica
    engine.write_batch([put(keys[0], b"z" * 500)])
    agree()
    engine.flush_now()
    assert agree() == 0


def test_map_grows_when_full(make_engine) -> None:
    engine = make_engine(lmdb_map_size=256 * 1024, partitions=2)
    value = b"y" * 1000
    for b in range(10):
        engine.write_batch([put(f"k{b}-{i}", value) for i in range(200)])
        engine.flush_now()
    assert engine.engine_stats()["lmdb_map_size"] > 256 * 1024
    assert engine.get("k9-199").value == value
    assert sum(len(list(engine.snapshot(p, 0).items())) for p in range(2)) == 2000


def test_closed_engine_refuses_calls(make_engine) -> None:
    engine = make_engine()
    engine.close()
    engine.close()  # idempotent
    with pytest.raises(EngineClosed):
        engine.write(put("a"))
    with pytest.raises(EngineClosed):
        engine.get("a")
    with pytest.raises(EngineClosed):
        engine.snapshot(0, 0)
    assert issubclass(EngineClosed, UprError)
