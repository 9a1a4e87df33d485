"""``Engine.stop_writes``: the old active's half of a graceful handover, on real LMDB.  Writes are
refused (retryably) from the seqno it returns on, the partition stays active so its streams keep
serving, and any state change or ``resume_writes`` ends the pause."""
from __future__ import annotations

import pytest

from engine.core.errors import PartitionNotActive
from engine.core.types import Op, PartitionState, WriteOp

P = 0


def keys_in(engine, partition: int, n: int) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        if engine.partition_of(f"key-{i}") == partition:
            out.append(f"key-{i}")
        i += 1
    return out


def test_stopped_writes_are_refused_and_the_returned_seqno_is_the_last(engine) -> None:
    a, b = keys_in(engine, P, 2)
    other = next(f"o-{i}" for i in range(1000) if engine.partition_of(f"o-{i}") != P)
    engine.write(WriteOp(Op.MUTATION, a, b"1"))
    last = engine.write(WriteOp(Op.MUTATION, a, b"2")).seqno
    assert engine.stop_writes(P) == last == engine.high_seqno(P)
    assert engine.state(P) is PartitionState.ACTIVE and engine.writes_stopped(P)
    with pytest.raises(PartitionNotActive, match="being handed over") as info:
        engine.write(WriteOp(Op.MUTATION, b, b"x"))
    assert info.value.partition == P
    results = engine.write_batch([(Op.MUTATION, b, b"x", None), (Op.MUTATION, other, b"y", None)])
    assert isinstance(results[0], PartitionNotActive) and results[1].seqno == 1  # other partitions unaffected
    assert engine.high_seqno(P) == last
    with engine.snapshot(P, 0) as snap:  # what it holds is still served
        assert [item.seqno for item in snap.items()] == [last]
    engine.resume_writes(P)
    assert engine.write(WriteOp(Op.MUTATION, b, b"x")).seqno == last + 1


@pytest.mark.parametrize("state", [PartitionState.REPLICA, PartitionState.DEAD])
def test_a_state_change_ends_the_pause(engine, state: PartitionState) -> None:
    (a,) = keys_in(engine, P, 1)
    engine.write(WriteOp(Op.MUTATION, a, b"1"))
    engine.stop_writes(P)
    engine.set_state(P, state)
    assert not engine.writes_stopped(P)
    engine.set_state(P, PartitionState.ACTIVE)
    assert engine.write(WriteOp(Op.MUTATION, a, b"2")).seqno == 2


def test_only_an_active_partition_can_stop_its_writes(engine) -> None:
    engine.set_state(P, PartitionState.REPLICA)
    with pytest.raises(PartitionNotActive):
        engine.stop_writes(P)


def test_stop_without_waiting_changes_nothing_while_the_writer_lock_is_held(engine) -> None:
    import threading

    (a,) = keys_in(engine, P, 1)
    last = engine.write(WriteOp(Op.MUTATION, a, b"1")).seqno
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        assert engine.stop_writes(P, wait=False) is None and not engine.writes_stopped(P)
    finally:
        release.set()
        holder.join(10)
    assert engine.stop_writes(P, wait=False) == last and engine.writes_stopped(P)
