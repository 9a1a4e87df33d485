"""A persist waiter is answered on its round's commit, not after the queues' bookkeeping: that
bookkeeping takes the engine's writer lock, which a write batch in progress may hold."""
from __future__ import annotations

from engine.core.types import Op, WriteOp


def test_a_persist_waiter_is_answered_while_the_writer_lock_is_held(make_engine) -> None:
    engine = make_engine(flush_interval_ms=1.0)
    written = engine.write(WriteOp(Op.MUTATION, "a", b"one", None))
    with engine._lock:  # a write batch in progress: the round's bookkeeping waits for it
        future = engine.persist_future({written.partition: written.seqno})
        future.result(timeout=30)  # answered by the commit alone
        # the queue is told only once the lock is free again
        assert engine._parts[written.partition].queue.persisted < written.seqno
    engine.flush_now()
    assert engine.stats(written.partition).persisted_seqno == written.seqno


def test_a_waiter_beyond_the_round_waits_for_the_next_one(make_engine) -> None:
    engine = make_engine(flush_interval_ms=1.0)
    first = engine.write(WriteOp(Op.MUTATION, "a", b"one", None))
    engine.persist_future({first.partition: first.seqno}).result(timeout=30)
    again = engine.write(WriteOp(Op.MUTATION, "a", b"two", None))
    engine.persist_future({again.partition: again.seqno}).result(timeout=30)
    assert engine.stats(again.partition).persisted_seqno == again.seqno
