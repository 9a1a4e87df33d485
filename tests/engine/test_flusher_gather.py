"""Flush rounds gather while nobody waits for persistence, and keep the interval's cadence for
anyone who does: a persist waiter (it kicks) or an eager persist listener (a ``persisted``
stream).  The gather time is set out of reach, so what persists a write is the waiter, the
listener, or a gathered round, never a race with the clock."""
from __future__ import annotations

import time

import pytest

from engine import flusher as flusher_module
from engine.core.types import FailoverEntry, Item, Op, PartitionState, WriteOp
from engine.replica import ItemsStep, MarkerStep


def _until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_without_a_waiter_a_round_gathers_and_a_waiter_cuts_it_short(make_engine,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flusher_module, "GATHER_S", 3600.0)
    engine = make_engine(flush_interval_ms=1.0)
    quiet = engine.add_persist_listener(lambda p: None, eager=False)  # a listener that only reports progress
    first = engine.write(WriteOp(Op.MUTATION, "a", b"one", None))
    time.sleep(0.3)  # ~300 intervals: a round keeping the interval's cadence would have persisted it
    assert engine.stats(first.partition).persisted_seqno < first.seqno
    engine.persist_future({first.partition: first.seqno}).result(timeout=30)  # the waiter kicks a round
    quiet()


def test_an_eager_listener_keeps_the_interval_and_its_removal_lets_rounds_gather(
        make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flusher_module, "GATHER_S", 3600.0)
    engine = make_engine(flush_interval_ms=1.0)
    flusher = engine._flusher
    remove = engine.add_persist_listener(lambda p: None)  # eager by default: a persisted stream
    assert flusher.eager_listeners == 1
    one = engine.write(WriteOp(Op.MUTATION, "a", b"one", None))
    _until(lambda: engine.stats(one.partition).persisted_seqno == one.seqno)
    remove()
    remove()  # twice: counted once
    assert flusher.eager_listeners == 0
    time.sleep(0.05)
    two = engine.write(WriteOp(Op.MUTATION, "b", b"two", None))
    time.sleep(0.3)
    assert engine.stats(two.partition).persisted_seqno < two.seqno


def test_a_gathered_round_persists_on_its_own(make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flusher_module, "GATHER_S", 0.05)
    engine = make_engine(flush_interval_ms=1.0)
    results = [engine.write(WriteOp(Op.MUTATION, f"k{i}", b"v", None)) for i in range(20)]
    _until(lambda: all(engine.stats(r.partition).persisted_seqno >= r.seqno for r in results))
    assert engine._flusher.gathered_rounds >= 1


def test_a_replica_only_listener_keeps_the_interval_for_replica_partitions_alone(
        make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica's acker: its active waits for the copy's rounds, nobody for this node's own
    ``memory`` writes."""
    monkeypatch.setattr(flusher_module, "GATHER_S", 3600.0)
    engine = make_engine(flush_interval_ms=1.0)
    remove = engine.add_persist_listener(lambda p: None, replicas_only=True)
    flusher = engine._flusher
    assert (flusher.eager_listeners, flusher.eager_replica_listeners) == (0, 1)
    own = engine.write(WriteOp(Op.MUTATION, "own", b"v", None))
    replica = (own.partition + 1) % 4
    engine.set_state(replica, PartitionState.REPLICA)
    engine.adopt_failover_log(replica, (FailoverEntry(77, 0),))
    time.sleep(0.3)  # ~300 intervals: only an active partition has something queued, so it gathers
    assert engine.stats(own.partition).persisted_seqno < own.seqno
    engine.apply_replica_run([MarkerStep(replica, 1, 1), ItemsStep(replica, [Item(b"r", 1, 5, 1, False, b"v")], True)])
    # the replica's change ends the gather at the next interval tick: both are persisted
    _until(lambda: engine.stats(replica).persisted_seqno == 1
           and engine.stats(own.partition).persisted_seqno >= own.seqno)
    remove()
    remove()  # twice: counted once
    assert flusher.eager_replica_listeners == 0


def test_an_eager_listener_registering_ends_a_gather_under_way(make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gather waits once, without looking every interval: a ``persisted`` stream arriving
    meanwhile still gets the interval's cadence, not the rest of the gather."""
    monkeypatch.setattr(flusher_module, "GATHER_S", 3600.0)
    engine = make_engine(flush_interval_ms=1.0)
    first = engine.write(WriteOp(Op.MUTATION, "a", b"one", None))
    _until(lambda: engine._flusher._gathering)
    assert engine.stats(first.partition).persisted_seqno < first.seqno
    remove = engine.add_persist_listener(lambda p: None)
    _until(lambda: engine.stats(first.partition).persisted_seqno == first.seqno)
    remove()


def test_a_replica_change_after_a_quiet_spell_is_persisted_at_once_and_a_steady_stream_is_paced(
        make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica's acker asks for a round once ``REPLICA_ROUND_S`` has passed since the last one
    began: the first change after a quiet spell gets the interval's cadence, the next ones wait
    (set out of reach here) unless a waiter kicks."""
    monkeypatch.setattr(flusher_module, "GATHER_S", 3600.0)
    monkeypatch.setattr(flusher_module, "REPLICA_ROUND_S", 3600.0)
    engine = make_engine(flush_interval_ms=1.0)
    remove = engine.add_persist_listener(lambda p: None, replicas_only=True)
    replica = 1
    engine.set_state(replica, PartitionState.REPLICA)
    engine.adopt_failover_log(replica, (FailoverEntry(77, 0),))
    engine._flusher._round_began = time.monotonic() - 7200.0  # a quiet spell: no round for long
    engine.apply_replica_run([MarkerStep(replica, 1, 1), ItemsStep(replica, [Item(b"r", 1, 5, 1, False, b"v")], True)])
    _until(lambda: engine.stats(replica).persisted_seqno == 1)
    engine.apply_replica_run([MarkerStep(replica, 2, 2), ItemsStep(replica, [Item(b"s", 2, 6, 1, False, b"v")], True)])
    time.sleep(0.3)  # ~300 intervals: a round began just now, so the copy's change waits
    assert engine.stats(replica).persisted_seqno == 1
    engine.persist_future({replica: 2}).result(timeout=30)  # a waiter still kicks a round
    remove()
