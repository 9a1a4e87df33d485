"""Flush rounds gather while nobody waits for persistence, and keep the interval's cadence for
anyone who does: a persist waiter (it kicks) or an eager persist listener (a ``persisted``
stream).  The gather time is set out of reach, so what persists a write is the waiter, the
listener, or a gathered round, never a race with the clock."""
from __future__ import annotations

import time

import pytest

from engine import flusher as flusher_module
from engine.core.types import Op, WriteOp


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
