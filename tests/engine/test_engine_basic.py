"""The engine facade on real LMDB: writes, reads, stats, snapshots, restart."""
from __future__ import annotations

import pytest

from engine.core.errors import KeyNotFound
from engine.core.types import Op, PartitionState, WriteOp, WriteResult


def put(key: str, value: bytes = b"v", cas: int | None = None) -> WriteOp:
    return WriteOp(Op.MUTATION, key, value, cas)


def delete(key: str, cas: int | None = None) -> WriteOp:
    return WriteOp(Op.DELETION, key, b"", cas)


def test_write_assigns_seqno_cas_rev_per_partition(engine) -> None:
    results = engine.write_batch([put(f"k{i}") for i in range(100)])
    assert all(isinstance(r, WriteResult) for r in results)
    by_partition: dict[int, list[int]] = {}
    for r in results:
        assert r.partition == engine.partition_of(r.key)
        by_partition.setdefault(r.partition, []).append(r.seqno)
    for p, seqnos in by_partition.items():
        assert seqnos == list(range(1, len(seqnos) + 1))
        assert engine.high_seqno(p) == len(seqnos)
    cas = [r.cas for r in results]
    assert cas == sorted(cas) and len(set(cas)) == len(cas)
    again = engine.write(put("k1", b"second"))
    assert again.rev == 2 and again.cas > max(cas)


def test_get_reads_queue_then_disk(engine) -> None:
    engine.write(put("a", b"one"))
    assert engine.get("a").value == b"one"
    engine.flush_now()
    assert engine.stats(engine.partition_of("a")).queue_depth == 0
    doc = engine.get("a")
    assert (doc.value, doc.rev, doc.seqno) == (b"one", 1, 1)
    engine.write(delete("a"))
    with pytest.raises(KeyNotFound):
        engine.get("a")
    engine.flush_now()
    with pytest.raises(KeyNotFound):
        engine.get("a")
    with pytest.raises(KeyNotFound):
        engine.get("never")


def test_rev_continues_from_disk_and_through_tombstones(engine) -> None:
    engine.write(put("x"))
    engine.flush_now()
    assert engine.write(put("x")).rev == 2
    assert engine.write(delete("x")).rev == 3
    engine.flush_now()
    assert engine.write(put("x")).rev == 4


def test_stats_track_high_persisted_depth_items(engine) -> None:
    engine.write_batch([put(f"k{i}") for i in range(50)])
    total = engine.all_stats()
    assert sum(s.high_seqno for s in total) == 50
    assert sum(s.item_count for s in total) == 50
    engine.flush_now()
    total = engine.all_stats()
    assert all(s.persisted_seqno == s.high_seqno for s in total)
    assert sum(s.queue_depth for s in total) == 0 and sum(s.queue_bytes for s in total) == 0
    engine.write(delete("k3"))
    assert sum(s.item_count for s in engine.all_stats()) == 49


def test_snapshot_disk_then_memory_each_key_once(make_engine) -> None:
    engine = make_engine(flush_interval_ms=60_000.0)
    keys = [f"k{i}" for i in range(40)]
    engine.write_batch([put(k, b"1") for k in keys])
    engine.flush_now()
    engine.write_batch([put(k, b"2") for k in keys[:10]])  # in memory, rewriting disk versions
    p = engine.partition_of("k0")
    snap = engine.snapshot(p, 0)
    assert [part.source for part in snap.parts] == ["disk", "memory"]
    disk, memory = snap.parts
    assert disk.start == 1 and disk.end == engine.persisted_seqno(p)
    assert memory.start == disk.end + 1 and memory.end == engine.high_seqno(p) == snap.high_seqno
    disk_items = [i for b in disk.batches() for i in b]
    mem_items = [i for b in memory.batches() for i in b]
    for part_items in (disk_items, mem_items):
        assert len({i.key for i in part_items}) == len(part_items)
        assert [i.seqno for i in part_items] == sorted(i.seqno for i in part_items)
    assert all(i.value == b"2" for i in mem_items)


def test_snapshot_after_high_is_empty(engine) -> None:
    engine.write(put("a"))
    p = engine.partition_of("a")
    snap = engine.snapshot(p, 1)
    assert snap.parts == [] and snap.high_seqno == 1


def test_clean_restart_keeps_data_and_failover_log(make_engine, tmp_path) -> None:
    first = make_engine()
    results = first.write_batch([put(f"k{i}", b"%d" % i) for i in range(30)])
    logs = [first.failover_log(p) for p in range(4)]
    assert all(len(log) == 1 and log[0].seqno == 0 for log in logs)
    first.close()
    second = make_engine(partitions=16)  # the stored partition count wins
    assert second.num_partitions == 4 and second.opened_clean
    assert [second.failover_log(p) for p in range(4)] == logs
    for r in results:
        assert second.get(r.key).seqno == r.seqno
    nxt = second.write(put("k0", b"again"))
    assert nxt.seqno == second.high_seqno(nxt.partition) == max(r.seqno for r in results if r.partition == nxt.partition) + 1


def test_set_state_replica_to_active_adds_entry(engine) -> None:
    engine.write_batch([put(f"k{i}") for i in range(10)])
    p = 0
    high = engine.high_seqno(p)
    engine.set_state(p, PartitionState.REPLICA)
    assert len(engine.failover_log(p)) == 1
    engine.set_state(p, PartitionState.ACTIVE)
    log = engine.failover_log(p)
    assert len(log) == 2 and log[0].seqno == high and log[0].uuid not in (0, log[1].uuid)


def test_listener_is_told_partitions(engine) -> None:
    seen: list[int] = []
    remove = engine.add_listener(seen.append)
    results = engine.write_batch([put(f"k{i}") for i in range(20)])
    assert sorted(seen) == sorted({r.partition for r in results})
    remove()
    engine.write(put("zz"))
    assert len(seen) == len({r.partition for r in results})


def test_a_batch_listener_is_told_each_writes_partitions_at_once(engine) -> None:
    calls: list[list[int]] = []
    remove = engine.add_listener(lambda partitions: calls.append(sorted(partitions)), batch=True)
    results = engine.write_batch([put(f"k{i}") for i in range(20)])
    assert calls == [sorted({r.partition for r in results})]
    remove()
    engine.write(put("zz"))
    assert len(calls) == 1


def test_flusher_running_until_close(make_engine) -> None:
    engine = make_engine()
    assert engine.flusher_running and not engine.closed
    engine.close()
    assert not engine.flusher_running and engine.closed


def test_second_engine_on_the_same_data_dir_is_refused(make_engine) -> None:
    from engine.storage.errors import DataDirInUse

    engine = make_engine()
    with pytest.raises(DataDirInUse):
        make_engine()
    engine.close()
    make_engine().close()  # the lock is released by close
