"""Persist durability: prompt flushes, shared fsyncs, clean shutdown; compaction; failover cap."""
from __future__ import annotations

import threading
import time
from concurrent.futures import wait

import pytest

from engine.core.errors import KeyNotFound
from engine.core.types import Op, PartitionState, WriteOp

SLOW_FLUSH = {"flush_interval_ms": 60_000.0}


def put(key, value=b"v") -> WriteOp:
    return WriteOp(Op.MUTATION, key, value)


def delete(key) -> WriteOp:
    return WriteOp(Op.DELETION, key)


def test_memory_writes_are_flushed_by_the_interval(make_engine) -> None:
    engine = make_engine(flush_interval_ms=5.0)
    r = engine.write(put("a"))
    deadline = time.monotonic() + 5
    while engine.persisted_seqno(r.partition) < r.seqno and time.monotonic() < deadline:
        time.sleep(0.005)
    assert engine.persisted_seqno(r.partition) == r.seqno


def test_persist_write_does_not_wait_for_the_flush_interval(make_engine) -> None:
    engine = make_engine(**SLOW_FLUSH)
    r = engine.write(put("a"))
    began = time.monotonic()
    engine.persist_future({r.partition: r.seqno}).result(timeout=5)
    assert time.monotonic() - began < 2.0  # the interval is 60 s
    assert engine.persisted_seqno(r.partition) >= r.seqno


def test_waiters_registered_together_share_one_fsync(make_engine) -> None:
    engine = make_engine(partitions=8, **SLOW_FLUSH)
    results = engine.write_batch([put(f"k{i}") for i in range(1000)])
    commits = engine.engine_stats()["lmdb_commits_total"]
    futures = [engine.persist_future({r.partition: r.seqno}) for r in results]
    wait(futures, timeout=10)
    assert all(f.done() and f.exception() is None for f in futures)
    used = engine.engine_stats()["lmdb_commits_total"] - commits
    assert 1 <= used <= 3, used


def test_concurrent_persist_writers_share_fsyncs(make_engine) -> None:
    engine = make_engine(partitions=8, **SLOW_FLUSH)
    threads, per_thread = 32, 20
    commits = engine.engine_stats()["lmdb_commits_total"]
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def writer(t: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                r = engine.write(put(f"t{t}-{i}"))
                engine.persist_future({r.partition: r.seqno}).result(timeout=30)
                assert engine.persisted_seqno(r.partition) >= r.seqno
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert errors == []
    used = engine.engine_stats()["lmdb_commits_total"] - commits
    acknowledged = threads * per_thread
    print(f"{acknowledged} persist writes acknowledged with {used:.0f} fsyncs")
    assert used <= acknowledged / 2


def test_close_flushes_and_clean_restart_adds_no_entry(make_engine) -> None:
    engine = make_engine(**SLOW_FLUSH)
    results = engine.write_batch([put(f"k{i}") for i in range(100)])
    logs = [engine.failover_log(p) for p in range(4)]
    engine.close()
    again = make_engine(**SLOW_FLUSH)
    assert again.opened_clean
    assert [again.failover_log(p) for p in range(4)] == logs
    for r in results:
        assert again.get(r.key).seqno == r.seqno
    assert all(s.persisted_seqno == s.high_seqno for s in again.all_stats())
    again.close()
    third = make_engine(**SLOW_FLUSH)
    assert [third.failover_log(p) for p in range(4)] == logs


def test_failover_log_is_capped(make_engine) -> None:
    engine = make_engine(partitions=1, failover_log_cap=3)
    for i in range(6):
        engine.write(put(f"k{i}"))
        engine.set_state(0, PartitionState.REPLICA)
        engine.set_state(0, PartitionState.ACTIVE)
    log = engine.failover_log(0)
    assert [e.seqno for e in log] == [6, 5, 4]
    assert len({e.uuid for e in log}) == 3
    engine.close()
    assert make_engine(partitions=1, failover_log_cap=3).failover_log(0) == log


def test_compaction_purges_tombstones_and_moves_purge_seqno(make_engine) -> None:
    engine = make_engine(partitions=1, **SLOW_FLUSH)
    engine.write_batch([put(f"k{i}") for i in range(10)])  # seqnos 1..10
    engine.write_batch([delete(f"k{i}") for i in range(5)])  # tombstones 11..15
    engine.flush_now()
    engine.write(delete("k5"))  # 16: only in memory, not purgeable yet
    assert engine.compact(older_than_s=3600) == {0: 0}
    assert engine.compact(purge_before_seqno={0: 13}) == {0: 12}
    assert engine.stats(0).purge_seqno == 12
    seqnos = [i.seqno for i in engine.snapshot(0, 0).items()]
    assert seqnos == [6, 7, 8, 9, 10, 13, 14, 15, 16]  # k5@6 on disk, its delete in memory
    assert engine.compact() == {0: 15}
    assert [i.seqno for i in engine.snapshot(0, 0).items()] == [6, 7, 8, 9, 10, 16]
    assert engine.snapshot(0, 0).purge_seqno == 15
    with pytest.raises(KeyNotFound):
        engine.get("k0")
    assert engine.write(put("k0")).rev == 1  # its history was purged
    engine.close()
    again = make_engine(partitions=1)
    assert again.stats(0).purge_seqno == 15
    assert again.compact() == {0: 16}


def test_failed_flush_fails_waiters_then_recovers(make_engine, monkeypatch) -> None:
    engine = make_engine(**SLOW_FLUSH)
    real = engine._store.flush_items

    def broken(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(engine._store, "flush_items", broken)
    r = engine.write(put("a"))
    with pytest.raises(OSError):
        engine.persist_future({r.partition: r.seqno}).result(timeout=10)
    assert engine.persisted_seqno(r.partition) == 0 and engine.engine_stats()["flush_errors_total"] >= 1
    monkeypatch.setattr(engine._store, "flush_items", real)
    engine.persist_future({r.partition: r.seqno}).result(timeout=10)
    assert engine.persisted_seqno(r.partition) == r.seqno


def test_close_with_a_failing_flush_is_recorded_as_unclean(make_engine, monkeypatch) -> None:
    engine = make_engine(**SLOW_FLUSH)
    engine.write(put("a"))
    engine.flush_now()
    logs = [engine.failover_log(p) for p in range(4)]
    r = engine.write(put("b"))
    monkeypatch.setattr(engine._store, "flush_items", lambda *a, **k: (_ for _ in ()).throw(OSError("io")))
    engine.close()
    again = make_engine(**SLOW_FLUSH)
    assert not again.opened_clean
    assert [len(again.failover_log(p)) for p in range(4)] == [len(log) + 1 for log in logs]
    with pytest.raises(KeyNotFound):
        again.get("b")
    assert again.high_seqno(r.partition) == r.seqno - 1


def test_close_right_after_writes_persists_them_all(tmp_path) -> None:
    """Writes queued while the flusher is mid-round must still be flushed by close()."""
    from engine.config import EngineConfig
    from engine.engine import Engine

    config = EngineConfig(data_dir=tmp_path / "d", partitions=2, flush_interval_ms=0.5)
    total = 0
    for round_ in range(40):
        engine = Engine.open(config)
        assert engine.opened_clean
        assert sum(s.high_seqno for s in engine.all_stats()) == total
        for i in range(20):
            engine.write(put(f"r{round_}-{i}"))
        total += 20
        engine.close()
