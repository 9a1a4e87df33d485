"""``Engine.apply_replica_run`` on real LMDB: a copy fed whole received runs ends exactly like one
fed message by message, and like its active (by-seqno history, high seqno, live item count),
including keys it knows only from disk; a bad step changes nothing of its own."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.core.errors import InvalidInput
from engine.core.types import FailoverEntry, Item, Op, PartitionState, WriteOp
from engine.engine import Engine
from engine.replica import ItemsStep, MarkerStep

PARTS = 2


def open_engine(path: Path) -> Engine:
    return Engine.open(EngineConfig(data_dir=path, partitions=PARTS, flush_interval_ms=2.0))


def replica(path: Path) -> Engine:
    engine = open_engine(path)
    for p in range(PARTS):
        engine.set_state(p, PartitionState.REPLICA)
        engine.adopt_failover_log(p, (FailoverEntry(77, 0),))
    return engine


def scan(engine: Engine, p: int) -> list[tuple]:
    with engine.snapshot(p, 0) as snap:
        return [tuple(i) for i in snap.items()]


def snapshot_steps(active: Engine, after: dict[int, int], rng: random.Random) -> list[MarkerStep | ItemsStep]:
    """What a replication stream sends for everything new on ``active``: per partition a marker,
    then the snapshot's items cut into batches of random size, the last one flagged."""
    steps: list[MarkerStep | ItemsStep] = []
    for p in range(PARTS):
        high = active.high_seqno(p)
        if high <= after[p]:
            continue
        with active.snapshot(p, after[p]) as snap:
            items = list(snap.items())
        steps.append(MarkerStep(p, after[p] + 1, high))
        i = 0
        while True:
            n = rng.randint(0, 4)
            chunk, i = items[i:i + n], i + n
            last = i >= len(items)
            steps.append(ItemsStep(p, chunk, last))
            if last:
                break
        after[p] = high
    return steps


@pytest.mark.parametrize("seed", range(6))
def test_runs_and_single_messages_give_the_actives_history_and_counts(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(30)]
    with open_engine(tmp_path / "active") as active, replica(tmp_path / "one") as one, \
            replica(tmp_path / "runs") as runs:
        after = {p: 0 for p in range(PARTS)}
        for round_ in range(8):
            live = {k for k in keys if _live(active, k)}
            ops = []
            for k in rng.sample(keys, 12):  # sets of new and existing keys, deletes of live ones
                if k in live and rng.random() < 0.3:
                    ops.append(WriteOp(Op.DELETION, k, b"", None))
                else:
                    ops.append(WriteOp(Op.MUTATION, k, f"{k}-{round_}".encode(), None))
            active.write_batch(ops)
            steps = snapshot_steps(active, after, rng)
            for step in steps:  # the per-message path
                if type(step) is MarkerStep:
                    one.replica_marker(step.partition, step.start, step.end)
                else:
                    one.apply_replicated(step.partition, step.items, last=step.last)
            while steps:  # runs of random length
                n = rng.randint(1, len(steps))
                runs.apply_replica_run(steps[:n])
                steps = steps[n:]
            if rng.random() < 0.5:  # later rounds find some keys only on disk
                for engine in (active, one, runs):
                    engine.flush_now()
        for engine in (active, one, runs):  # a scan's deduplication depends on what is persisted
            engine.flush_now()
        for p in range(PARTS):
            assert scan(runs, p) == scan(one, p) == scan(active, p)
            assert runs.high_seqno(p) == one.high_seqno(p) == active.high_seqno(p)
            assert runs.stats(p).item_count == one.stats(p).item_count == active.stats(p).item_count


def _live(engine: Engine, key: str) -> bool:
    try:
        engine.get(key)
    except Exception:  # noqa: BLE001 - KeyNotFound: not live
        return False
    return True


def test_a_bad_step_changes_nothing_of_its_own_and_the_steps_before_it_stay(tmp_path: Path) -> None:
    with replica(tmp_path / "r") as engine:
        seen: list[int] = []
        engine.add_listener(seen.append)
        good = Item(b"a", 1, 100, 1, False, b"v")
        bad = Item(b"b", 1, 101, 1, False, b"v")  # seqno not above the high seqno 1
        with pytest.raises(InvalidInput):
            engine.apply_replica_run([MarkerStep(0, 1, 5), ItemsStep(0, [good], False), ItemsStep(0, [bad], False)])
        assert scan(engine, 0) == [tuple(good)]
        assert engine.high_seqno(0) == 1
        assert seen == [0]  # listeners hear of what was applied


def test_try_apply_takes_nothing_while_a_lock_is_held_and_applies_once_they_are_free(tmp_path: Path) -> None:
    import threading

    with replica(tmp_path / "r") as engine:
        seen: list[int] = []
        engine.add_listener(seen.append)
        steps = [MarkerStep(0, 1, 1), ItemsStep(0, [Item(b"a", 1, 100, 1, False, b"v")], True)]
        for lock in (engine._lock, engine._turn):  # the writer lock, then the LMDB turn, held elsewhere
            held, release = threading.Event(), threading.Event()

            def hold(lock=lock) -> None:
                with lock:
                    held.set()
                    release.wait(5)

            holder = threading.Thread(target=hold)
            holder.start()
            held.wait(5)
            assert engine.try_apply_replica_run(steps) is False
            release.set()
            holder.join()
            assert engine.high_seqno(0) == 0 and seen == []
        assert engine.try_apply_replica_run(steps) is True
        assert scan(engine, 0) == [tuple(steps[1].items[0])] and engine.high_seqno(0) == 1
        assert seen == [0]
        # both released (the flusher, woken by the applied item, may hold the turn for a moment)
        assert engine._lock.acquire(timeout=5) and engine._turn.acquire(timeout=5)
        engine._turn.release()
        engine._lock.release()


class _Queue:
    def __init__(self, keys: set[bytes]) -> None:
        self.index = dict.fromkeys(keys)


class _Part:
    def __init__(self, keys: set[bytes]) -> None:
        self.queue = _Queue(keys)


def _items(p: int, *specs: tuple[bytes, int]) -> ItemsStep:
    return ItemsStep(p, [Item(key, seqno, 100 + seqno, rev, False, b"v")
                         for seqno, (key, rev) in enumerate(specs, start=1)], False)


@pytest.mark.parametrize("steps, queued, reads", [
    ([_items(0, (b"a", 1), (b"b", 1))], set(), False),  # new keys (rev 1): no record to look up
    ([_items(0, (b"a", 2))], {b"a"}, False),  # rewritten, its last version still queued
    ([_items(0, (b"a", 2))], set(), True),  # rewritten, only the persisted record knows it
    ([_items(0, (b"a", 1), (b"a", 2))], set(), False),  # written earlier in the same run
    ([_items(0, (b"a", 1)), _items(1, (b"a", 2))], set(), True),  # the same key, another partition
    ([MarkerStep(0, 1, 5)], set(), False),
])
def test_a_run_reads_persisted_records_only_for_rewrites_the_queue_does_not_hold(
        steps: list[MarkerStep | ItemsStep], queued: set[bytes], reads: bool) -> None:
    from engine.replica import reads_persisted_records

    parts = {0: _Part(queued), 1: _Part(set())}
    assert reads_persisted_records(steps, parts.__getitem__) is reads


def test_try_apply_leaves_a_run_that_would_read_lmdb_to_the_thread_path(tmp_path: Path) -> None:
    with replica(tmp_path / "r") as engine:
        engine.apply_replica_run([MarkerStep(0, 1, 1), ItemsStep(0, [Item(b"a", 1, 100, 1, False, b"v1")], True)])
        engine.flush_now()  # b"a" persisted: no longer in the queue index
        rewrite = [MarkerStep(0, 2, 2), ItemsStep(0, [Item(b"a", 2, 101, 2, False, b"v2")], True)]
        assert engine.try_apply_replica_run(rewrite) is False
        assert engine.high_seqno(0) == 1
        engine.apply_replica_run(rewrite)
        engine.flush_now()
        assert engine.high_seqno(0) == 2 and [i[:2] for i in scan(engine, 0)] == [(b"a", 2)]


def test_an_inline_run_naming_a_partition_that_is_no_longer_a_replica_applies_nothing(tmp_path: Path) -> None:
    """``try_apply_replica_run`` looks each partition up once, under the lock: a run whose last
    partition turned active is refused whole (``NotReplica``), the locks are free again."""
    from engine.core.errors import NotReplica

    engine = replica(tmp_path / "r")
    try:
        engine.set_state(1, PartitionState.ACTIVE)
        run = [MarkerStep(0, 1, 1), ItemsStep(0, [Item(b"k", 1, 5, 1, False, b"v")], True),
               MarkerStep(1, 1, 1), ItemsStep(1, [Item(b"j", 1, 6, 1, False, b"w")], True)]
        with pytest.raises(NotReplica):
            engine.try_apply_replica_run(run)
        assert engine.high_seqno(0) == 0
        assert engine.try_apply_replica_run(run[:2]) and engine.high_seqno(0) == 1
    finally:
        engine.close()
