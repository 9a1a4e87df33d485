"""An idle flusher sleeps until the engine announces a change: no rounds while nothing is
queued, and a write after a long sleep is persisted without anyone kicking the thread."""
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


def test_an_idle_flusher_makes_no_rounds_and_a_write_wakes_it(make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # the safety timeout out of reach: only the write's announcement can wake the thread
    monkeypatch.setattr(flusher_module, "IDLE_WAKE_S", 3600.0)
    engine = make_engine(flush_interval_ms=1.0)
    flusher = engine._flusher
    result = engine.write(WriteOp(Op.MUTATION, "a", b"one", None))
    _until(lambda: engine.stats(result.partition).persisted_seqno == result.seqno)
    time.sleep(0.05)  # the round after the commit finds nothing and the thread goes to sleep
    rounds = flusher.rounds
    time.sleep(0.3)  # at a 1 ms interval a polling thread would look ~300 times
    assert flusher.rounds - rounds <= 1
    again = engine.write(WriteOp(Op.MUTATION, "b", b"two", None))
    _until(lambda: engine.stats(again.partition).persisted_seqno == again.seqno)
