"""Replica support in the engine, on real LMDB: replicated snapshots keep the active's metadata,
the failover log is the active's, promotion branches at the last whole snapshot, takeover does
not, a reset empties the partition, and a crash mid-snapshot keeps the last whole snapshot."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.errors import InvalidInput, KeyNotFound, NotReplica, PartitionNotActive
from engine.core.replica_snapshots import SnapshotMark
from engine.core.types import FailoverEntry, Item, Op, PartitionState, WriteOp

P = 0


def key_in(engine, partition: int, n: int = 1) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        if engine.partition_of(f"key-{i}") == partition:
            out.append(f"key-{i}")
        i += 1
    return out


def as_replica(engine, log=(FailoverEntry(77, 0),)):
    engine.set_state(P, PartitionState.REPLICA)
    engine.adopt_failover_log(P, log)
    return engine


def item(key: str, seqno: int, cas: int, rev: int = 1, deleted: bool = False, value: bytes = b"v") -> Item:
    return Item(key.encode(), seqno, cas, rev, deleted, b"" if deleted else value)


def test_replicated_items_keep_the_actives_seqno_cas_rev_and_deletions(make_engine) -> None:
    engine = as_replica(make_engine())
    a, b = key_in(engine, P, 2)
    engine.replica_marker(P, 1, 10)
    engine.apply_replicated(P, [item(a, 3, 5000, rev=4, value=b"A"), item(b, 7, 6000, rev=2)], last=True)
    assert engine.high_seqno(P) == 10  # the whole snapshot: its deduplicated tail is held too
    doc = engine.get(a)
    assert (doc.seqno, doc.cas, doc.rev, doc.value) == (3, 5000, 4, b"A")
    engine.replica_marker(P, 11, 11)
    engine.apply_replicated(P, [item(b, 11, 7000, rev=3, deleted=True)], last=True)
    with pytest.raises(KeyNotFound):
        engine.get(b)
    assert engine.stats(P).item_count == 1
    engine.flush_now()
    snap = engine.snapshot(P, 0)
    rows = [(i.key, i.seqno, i.cas, i.rev, i.deleted) for i in snap.items()]
    assert rows == [(a.encode(), 3, 5000, 4, False), (b.encode(), 11, 7000, 3, True)]
    with pytest.raises(PartitionNotActive):  # client writes stay refused on a replica
        engine.write(WriteOp(Op.MUTATION, a, b"client"))


def test_a_bad_batch_changes_nothing(make_engine) -> None:
    engine = as_replica(make_engine())
    (a,) = key_in(engine, P)
    with pytest.raises(InvalidInput):  # no marker yet
        engine.apply_replicated(P, [item(a, 1, 1)], last=False)
    engine.replica_marker(P, 1, 10)
    for bad in ([item(a, 11, 1)], [item(a, 5, 1), item(a, 4, 2)], [item(a, 0, 1)]):
        with pytest.raises(InvalidInput):
            engine.apply_replicated(P, bad, last=False)
        assert engine.high_seqno(P) == 0 and engine.stats(P).item_count == 0
    with pytest.raises(InvalidInput):
        engine.replica_marker(P, 0, 0)  # ends at what it already holds


def test_replica_operations_refuse_other_states(make_engine) -> None:
    engine = make_engine()
    for call in (lambda: engine.replica_marker(P, 1, 2), lambda: engine.promote(P),
                 lambda: engine.take_over(P), lambda: engine.reset_partition(P),
                 lambda: engine.adopt_failover_log(P, [FailoverEntry(1, 0)])):
        with pytest.raises(NotReplica):
            call()


def test_promotion_branches_at_the_last_whole_snapshot_and_keeps_cas_increasing(make_engine) -> None:
    engine = as_replica(make_engine(), (FailoverEntry(77, 0),))
    keys = key_in(engine, P, 3)
    far_future = 1 << 62
    engine.replica_marker(P, 1, 5)
    engine.apply_replicated(P, [item(keys[0], 5, far_future)], last=True)
    engine.replica_marker(P, 6, 10)
    engine.apply_replicated(P, [item(keys[1], 7, far_future + 1)], last=False)  # partial snapshot
    entry = engine.promote(P)
    assert entry.seqno == 5 and entry.uuid not in (0, 77)
    assert engine.failover_log(P) == (entry, FailoverEntry(77, 0))
    assert engine.state(P) is PartitionState.ACTIVE
    result = engine.write(WriteOp(Op.MUTATION, keys[2], b"new"))
    assert result.seqno == 8 and result.cas > far_future + 1


def test_takeover_keeps_the_failover_log(make_engine) -> None:
    log = (FailoverEntry(77, 4), FailoverEntry(5, 0))
    engine = as_replica(make_engine(), log)
    (a,) = key_in(engine, P)
    engine.replica_marker(P, 1, 6)
    engine.apply_replicated(P, [item(a, 6, 10)], last=True)
    engine.take_over(P)
    assert engine.failover_log(P) == log and engine.state(P) is PartitionState.ACTIVE


def stored_state(engine, partition: int = P) -> bytes:
    store = engine._store  # the state on disk, read beside the running engine
    with store.read_txn() as txn:
        return bytes(txn.get(b"state/%d" % partition, db=store.meta_db))


def test_takeover_takes_writes_before_its_state_commit_which_the_first_flush_carries(make_engine) -> None:
    log = (FailoverEntry(77, 0),)
    engine = as_replica(make_engine(flush_interval_ms=60_000.0), log)
    a, b = key_in(engine, P, 2)
    engine.replica_marker(P, 1, 6)
    engine.apply_replicated(P, [item(a, 6, 10)], last=True)
    engine.flush_now()
    engine.take_over(P, commit=False)
    assert engine.state(P) is PartitionState.ACTIVE and stored_state(engine) == b"replica"
    written = engine.write(WriteOp(Op.MUTATION, b, b"taken as active"))
    assert engine.persisted_seqno(P) == 6 and stored_state(engine) == b"replica"
    engine.flush_now()  # the flush of a write taken as active commits the state with it
    assert engine.persisted_seqno(P) == written.seqno and stored_state(engine) == b"active"
    assert engine.commit_states() is False and engine.failover_log(P) == log


def test_takeover_commit_writes_the_state_when_no_flush_did(make_engine) -> None:
    engine = as_replica(make_engine(flush_interval_ms=60_000.0))
    engine.take_over(P, commit=False)
    assert stored_state(engine) == b"replica"
    assert engine.commit_states() is True and stored_state(engine) == b"active"
    assert engine.commit_states() is False


def test_takeover_without_waiting_changes_nothing_while_the_writer_lock_is_held(make_engine) -> None:
    import threading

    engine = as_replica(make_engine(flush_interval_ms=60_000.0))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        assert engine.take_over(P, commit=False, wait=False) is False
        assert engine.state(P) is PartitionState.REPLICA and engine._store.staged == 0
    finally:
        release.set()
        holder.join()
    assert engine.take_over(P, commit=False, wait=False) is True and engine.state(P) is PartitionState.ACTIVE


def test_a_staged_state_survives_a_failed_transaction_and_goes_first_in_the_next(make_engine) -> None:
    engine = as_replica(make_engine(flush_interval_ms=60_000.0))
    store = engine._store
    engine.take_over(P, commit=False)

    def fails(txn) -> None:
        raise RuntimeError("the transaction's own step failed")

    with pytest.raises(RuntimeError):
        store.write(fails)
    assert store.staged == 1 and stored_state(engine) == b"replica"
    engine.set_state(P, PartitionState.DEAD)  # a later change in the same transaction wins
    assert store.staged == 0 and stored_state(engine) == b"dead"


@pytest.mark.parametrize("when", ["before-flush", "after-flush"])
def test_a_crash_between_takeover_and_its_state_commit_keeps_state_and_writes_together(
        make_engine, tmp_path: Path, when: str) -> None:
    script = Path(__file__).with_name("takeover_crash.py")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "data"), when], capture_output=True,
                          timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()
    key = proc.stdout.decode().strip()
    engine = make_engine()
    if when == "before-flush":  # the replica it was, with nothing it took as active
        assert engine.state(P) is PartitionState.REPLICA and engine.high_seqno(P) == 6
        assert engine.failover_log(P) == (FailoverEntry(77, 0),)
        with pytest.raises(KeyNotFound):
            engine.get(key)
    else:  # the active it became, with the write (an unclean stop of an active starts a branch)
        assert engine.state(P) is PartitionState.ACTIVE and engine.get(key).seqno == 7
        assert engine.failover_log(P)[-1] == FailoverEntry(77, 0)


def test_reset_empties_the_partition_and_survives_restart(make_engine, tmp_path: Path) -> None:
    engine = make_engine()
    a, b = key_in(engine, P, 2)
    engine.write(WriteOp(Op.MUTATION, a, b"mine"))
    engine.flush_now()
    as_replica(engine)
    engine.replica_marker(P, 2, 3)
    engine.apply_replicated(P, [item(b, 3, 99)], last=True)  # queued, maybe not flushed yet
    engine.reset_partition(P)
    assert (engine.high_seqno(P), engine.persisted_seqno(P), engine.failover_log(P)) == (0, 0, ())
    for k in (a, b):
        with pytest.raises(KeyNotFound):
            engine.get(k)
    engine.flush_now()
    engine.close()
    again = make_engine()
    assert (again.high_seqno(P), again.failover_log(P), again.stats(P).item_count) == (0, (), 0)
    assert list(again.snapshot(P, 0).items()) == []
    assert again.replica_mark(P) == (0, SnapshotMark(0, 0, 0))
    for k in (a, b):
        with pytest.raises(KeyNotFound):
            again.get(k)
    # streaming again from 0 works on the emptied partition
    again.replica_marker(P, 1, 3)
    again.apply_replicated(P, [item(b, 3, 99)], last=True)
    assert again.get(b).seqno == 3


def test_a_crash_mid_snapshot_keeps_the_last_whole_snapshot_end(make_engine, tmp_path: Path) -> None:
    data = tmp_path / "data"
    script = Path(__file__).with_name("replica_crash.py")
    proc = subprocess.run([sys.executable, str(script), str(data)], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()
    engine = make_engine()
    assert not engine.opened_clean
    assert engine.state(P) is PartitionState.REPLICA
    # a replica's history is its active's: no new branch after an unclean stop
    assert engine.failover_log(P) == (FailoverEntry(77, 0),)
    high, mark = engine.replica_mark(P)
    assert high == 14 and mark == SnapshotMark(11, 20, 10)  # resume inside (11, 20); whole up to 10
    assert engine.promote(P).seqno == 10


def test_replica_held_counts_whole_snapshots_only_in_memory_and_on_disk(make_engine) -> None:
    engine = as_replica(make_engine())
    a, b, c = key_in(engine, P, 3)
    assert engine.replica_held(P) == (0, 0)
    engine.replica_marker(P, 1, 5)
    engine.apply_replicated(P, [item(a, 2, 100)], last=False)
    assert engine.replica_held(P) == (0, 0)  # in the middle of a snapshot: a promotion would drop it
    engine.apply_replicated(P, [item(b, 5, 101)], last=True)
    assert engine.replica_held(P)[0] == 5
    engine.flush_now()
    assert engine.replica_held(P) == (5, 5)
    engine.replica_marker(P, 6, 9)
    engine.apply_replicated(P, [item(c, 7, 102)], last=False)
    engine.flush_now()  # persisted in the middle of a snapshot: a crash keeps the last whole one
    assert engine.replica_held(P) == (5, 5)
    engine.apply_replicated(P, [item(a, 9, 103)], last=True)
    assert engine.replica_held(P)[0] == 9
    engine.flush_now()
    assert engine.replica_held(P) == (9, 9)
