"""A large received run is applied in bounded holds of the writer lock (``engine.replica.take_chunk``,
``Engine.apply_replica_run``): the copy ends exactly as when fed message by message, a bad batch
larger than a hold still changes nothing, and a write waiting for the lock gets in between holds."""
from __future__ import annotations

import threading
from collections import deque
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.core.errors import InvalidInput
from engine.core.types import FailoverEntry, Item, Op, PartitionState, WriteOp
from engine.engine import Engine
from engine.replica import HOLD_ITEMS, ItemsStep, MarkerStep, take_chunk


def replica(path: Path, *, active: tuple[int, ...] = ()) -> Engine:
    engine = Engine.open(EngineConfig(data_dir=path, partitions=2, flush_interval_ms=2.0))
    for p in range(2):
        if p in active:
            continue
        engine.set_state(p, PartitionState.REPLICA)
        engine.adopt_failover_log(p, (FailoverEntry(77, 0),))
    return engine


def items(first: int, last: int) -> list[Item]:
    return [Item(f"k{s % 700}".encode(), s, 1000 + s, 1 if s < 700 else 2, False, b"v%d" % s)
            for s in range(first, last + 1)]


def run_of(n: int, batch: int) -> list[MarkerStep | ItemsStep]:
    """One snapshot ``(1, n)`` sent as batches of ``batch`` items, the last one flagged."""
    steps: list[MarkerStep | ItemsStep] = [MarkerStep(0, 1, n)]
    for first in range(1, n + 1, batch):
        last = min(first + batch - 1, n)
        steps.append(ItemsStep(0, items(first, last), last == n))
    return steps


def scan(engine: Engine, p: int) -> list[tuple]:
    with engine.snapshot(p, 0) as snap:
        return [tuple(i) for i in snap.items()]


def test_chunks_carry_at_most_a_hold_and_only_a_snapshots_last_piece_is_flagged(tmp_path: Path) -> None:
    with replica(tmp_path / "r") as engine:
        engine.replica_marker(0, 1, 1000)
        pending = deque(run_of(1000, 600)[1:])
        chunks = []
        while pending:
            chunks.append(take_chunk(pending, engine._replica, HOLD_ITEMS))
        assert all(sum(len(s.items) for s in c) <= HOLD_ITEMS for c in chunks)
        pieces = [s for c in chunks for s in c]
        assert [i.seqno for s in pieces for i in s.items] == list(range(1, 1001))
        assert [s.last for s in pieces] == [False] * (len(pieces) - 1) + [True]


@pytest.mark.parametrize("batch", [7, 600, 3000])
def test_a_large_run_in_holds_ends_like_the_per_message_path(tmp_path: Path, batch: int) -> None:
    steps = run_of(3000, batch)
    with replica(tmp_path / "runs") as runs, replica(tmp_path / "one") as one:
        for step in steps:
            if type(step) is MarkerStep:
                one.replica_marker(step.partition, step.start, step.end)
            else:
                one.apply_replicated(step.partition, step.items, last=step.last)
        holds = runs.replica_apply_holds
        runs.apply_replica_run(steps)
        assert runs.replica_apply_holds - holds >= 3000 // HOLD_ITEMS
        for engine in (runs, one):
            engine.flush_now()
        assert scan(runs, 0) == scan(one, 0)
        assert runs.high_seqno(0) == one.high_seqno(0) == 3000
        assert runs.replica_mark(0)[1].complete_end == 3000
        assert runs.stats(0).item_count == one.stats(0).item_count == 700


def test_a_bad_batch_larger_than_a_hold_changes_nothing_of_its_own(tmp_path: Path) -> None:
    with replica(tmp_path / "r") as engine:
        good = items(1, 10)
        bad = items(11, 1000)
        bad[-1] = bad[-1]._replace(seqno=2000)  # outside the snapshot (1, 1000)
        with pytest.raises(InvalidInput):
            engine.apply_replica_run([MarkerStep(0, 1, 1000), ItemsStep(0, good, False), ItemsStep(0, bad, True)])
        assert engine.high_seqno(0) == 10
        assert [t[1] for t in scan(engine, 0)] == list(range(1, 11))


def test_a_waiting_write_gets_in_between_two_holds(tmp_path: Path) -> None:
    n = 40 * HOLD_ITEMS
    with replica(tmp_path / "r", active=(1,)) as engine:
        key = next(f"w{i}" for i in range(1000) if engine.partition_of(f"w{i}") == 1)
        seen_high: list[int] = []
        engine._lock.acquire()  # both the run and the write queue up behind it
        try:
            applier = threading.Thread(target=engine.apply_replica_run, args=(run_of(n, 1000),))
            applier.start()

            def write() -> None:
                engine.write(WriteOp(Op.MUTATION, key, b"v", None))
                seen_high.append(engine.high_seqno(0))

            writer = threading.Thread(target=write)
            writer.start()
            while engine._writes_waiting == 0:
                threading.Event().wait(0.001)
        finally:
            engine._lock.release()
        writer.join(30)
        applier.join(30)
        assert engine.high_seqno(0) == n
        assert seen_high and seen_high[0] < n  # the write did not wait for the whole run
