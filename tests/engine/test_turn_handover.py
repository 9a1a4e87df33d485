"""What a write on a node building copies waits for: a flush round hands the LMDB turn to a
waiting thread between slices of its build, and a state change commits after releasing the
writer lock, durable on return all the same."""
from __future__ import annotations

import threading
import time

import pytest

from engine import flusher as flusher_module
from engine.core.keys import partition_for_key
from engine.core.types import Op, PartitionState, WriteOp
from engine.flusher import hand_over_turn, lmdb_turn


def _until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def put(key: str, value: bytes = b"v") -> WriteOp:
    return WriteOp(Op.MUTATION, key, value, None)


def test_hand_over_turn_lets_the_waiter_in_first_and_takes_the_turn_back() -> None:
    turn = lmdb_turn()
    turn.acquire()
    assert hand_over_turn(turn) is False and turn.locked()  # nobody waits: kept
    order: list[str] = []

    def waiter() -> None:
        with turn:
            order.append("waiter")

    thread = threading.Thread(target=waiter)
    thread.start()
    _until(lambda: turn.waiting == 1)
    assert hand_over_turn(turn) is True
    order.append("holder again")
    assert turn.locked() and turn.waiting == 0
    turn.release()
    thread.join(10)
    assert order == ["waiter", "holder again"]


def test_a_round_in_slices_lets_a_waiter_in_before_its_commit_and_persists_everything(
        make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flusher_module, "TURN_SLICE_ITEMS", 100)
    engine = make_engine(partitions=1)
    store, turn = engine._store, engine._turn
    real_flush_items = store.flush_items
    seen: list[int] = []  # the persisted seqno when the waiter got the turn

    def waiter() -> None:
        with turn:
            seen.append(engine.stats(0).persisted_seqno)

    started: list[threading.Thread] = []

    def flush_items(txn, p, items, *, compact=True):
        if not started and len(items) == 100:  # the first slice of a round in slices
            thread = threading.Thread(target=waiter)
            started.append(thread)
            thread.start()
            _until(lambda: turn.waiting >= 1)
        return real_flush_items(txn, p, items, compact=compact)

    monkeypatch.setattr(store, "flush_items", flush_items)
    engine.write_batch([put(f"k{i}", b"first %d" % i) for i in range(1000)])
    engine.persist_future({0: engine.high_seqno(0)}).result(30)
    engine.write_batch([put(f"k{i}", b"second %d" % i) for i in range(0, 1000, 2)])  # stale marks across slices
    engine.persist_future({0: engine.high_seqno(0)}).result(30)
    assert started, "no round was written in slices"
    started[0].join(10)
    assert engine._flusher.turn_handovers >= 1
    assert seen and seen[0] < engine.high_seqno(0)  # in before that round committed
    engine.close()
    again = make_engine(partitions=1)
    assert again.stats(0).persisted_seqno == 1500
    for i in range(1000):
        assert again.get(f"k{i}").value == (b"second %d" % i if i % 2 == 0 else b"first %d" % i)


def test_set_state_commits_after_the_writer_lock_and_is_durable_on_return(make_engine) -> None:
    engine = make_engine(partitions=4)
    store = engine._store
    other = next(k for k in (f"key{i}" for i in range(100)) if partition_for_key(k.encode(), 4) != 0)
    done = threading.Event()
    with store._write_lock:  # every commit (the flusher's too) waits, as behind a long flush round
        changer = threading.Thread(target=lambda: (engine.set_state(0, PartitionState.REPLICA), done.set()))
        changer.start()
        _until(lambda: engine.state(0) is PartitionState.REPLICA)
        engine.write(put(other))  # the writer lock is free while the state's commit waits
        assert not done.is_set() and store.staged >= 1
    changer.join(10)
    assert done.is_set() and store.staged == 0
    log = engine.failover_log(0)
    engine.close()
    again = make_engine(partitions=4)
    assert again.state(0) is PartitionState.REPLICA and again.failover_log(0) == log
    assert again.get(other).value == b"v"
