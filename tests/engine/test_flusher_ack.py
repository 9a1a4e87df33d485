"""A persist waiter is answered as soon as its round has committed and told the queues, not after
the round's persist listeners (streams, a replica's acker) have run."""
from __future__ import annotations

import threading

from engine.core.types import Op, WriteOp


def test_a_persist_waiter_is_answered_before_the_persist_listeners_run(make_engine) -> None:
    engine = make_engine(flush_interval_ms=1.0)
    release = threading.Event()
    entered = threading.Event()

    def slow_listener(_partition: int) -> None:
        entered.set()
        release.wait(30)

    engine.add_persist_listener(slow_listener, eager=False)
    try:
        written = engine.write(WriteOp(Op.MUTATION, "a", b"one", None))
        future = engine.persist_future({written.partition: written.seqno})
        future.result(timeout=30)  # answered while the round's listener still holds the flusher
        assert engine.persisted_seqno(written.partition) >= written.seqno
    finally:
        release.set()
    assert entered.wait(30)


def test_a_waiter_beyond_the_round_waits_for_the_next_one(make_engine) -> None:
    engine = make_engine(flush_interval_ms=1.0)
    first = engine.write(WriteOp(Op.MUTATION, "a", b"one", None))
    engine.persist_future({first.partition: first.seqno}).result(timeout=30)
    again = engine.write(WriteOp(Op.MUTATION, "a", b"two", None))
    engine.persist_future({again.partition: again.seqno}).result(timeout=30)
    assert engine.persisted_seqno(again.partition) >= again.seqno
