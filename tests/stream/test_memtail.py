"""Tail visits produced on the event loop from the write queue's memory (``Engine.memory_snapshot``),
against a real engine (LMDB in a tmp dir): the memory-only snapshot must be exactly what
``Engine.snapshot`` gives whenever it is used, and refused whenever a disk part could be needed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.protocol import messages as M

from app.stream.passes import _NotInMemory, _produce_many
from app.stream.cursor import Batch, Marker, PartitionCursor
from engine.config import EngineConfig
from engine.engine import Engine
from engine.protocol.frames import decode_binary, encode_binary_columns
from engine.core.errors import KeyNotFound
from engine.core.types import Op, WriteOp


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    eng = Engine.open(EngineConfig(data_dir=tmp_path / "data", partitions=1, flush_interval_ms=60_000))
    yield eng
    eng.close()


def run(engine: Engine, steps: str) -> None:
    """``w<key>``: write that key; ``f``: flush (persist the queue)."""
    for step in steps.split():
        if step == "f":
            engine.flush_now()
        else:
            engine.write(WriteOp(Op.MUTATION, step[1:], b"v" * 50))


def shape(snap: Any) -> tuple[Any, ...]:
    return (snap.high_seqno, snap.purge_seqno,
            [(p.source, p.start, p.end, [(i.key, i.seqno) for b in p.batches() for i in b]) for p in snap.parts])


def latest(shaped: Any) -> list[tuple[str, int]]:
    """(key, seqno) of every item of every part of a ``shape``, in order, without versions a
    later one supersedes."""
    items = [item for part in shaped[2] for item in part[3]]
    last = {key: seqno for key, seqno in items}
    return [(key, seqno) for key, seqno in items if last[key] == seqno]


# (writes and flushes, position after which the consumer reads, memory-only?)
CASES = [
    ("", 0, True),                             # nothing written: empty, same as the engine's
    ("wa wb wc", 0, True),                     # never flushed: all in memory
    ("wa wb wa wc wa", 0, True),               # rewrites deduplicated exactly as the engine does
    ("wa wb wc f wd we", 3, True),             # flushed up to the position: memory part only
    ("wa wb wc f wd we", 5, True),             # caught up: nothing left
    ("wa wb wc f wd we", 2, True),             # just behind the flusher: the last flush is still in memory
    ("wa wb wc f", 0, True),                   # everything persisted by one small flush
    ("wa wb wc f wa", 3, True),                # a rewrite of a persisted key, in memory
    ("wa wb f wa wc", 0, True),                # a key flushed, then rewritten: read once, at its latest
    ("wa f wa wb f wa", 1, True),              # the same across two flushes
    ("wa wb f wc wd f we", 2, True),           # the last flush starts at the position
    ("wa wb f wc wd f we", 1, False),          # seqno 2 went with an earlier flush: disk only
    ("wa f wa wb f wa", 0, False),             # the same
]


@pytest.mark.parametrize(("steps", "after", "in_memory"), CASES)
def test_memory_snapshot_is_the_engines_snapshot_or_refused(engine: Engine, steps: str, after: int,
                                                           in_memory: bool) -> None:
    run(engine, steps)
    snap = engine.memory_snapshot(0, after)
    backlog = engine.memory_backlog(0, after)
    with engine.snapshot(0, after) as reference:
        expected = shape(reference)
        has_disk = any(p.source == "disk" for p in reference.parts)
        if in_memory and has_disk:
            # one memory part over the same range, each key once at its latest seqno: what a
            # deduplicated snapshot of the range holds
            assert snap is not None
            got = shape(snap)
            assert [p[:3] for p in got[2]] == [("memory", after + 1, reference.high_seqno)]
            assert got[:2] == expected[:2]
            assert got[2][0][3] == latest(expected) == latest(got)
            assert backlog == engine.high_seqno(0) - after
            return
    if in_memory:
        assert snap is not None and not has_disk
        assert shape(snap) == expected
        assert backlog == engine.high_seqno(0) - after
    else:
        assert has_disk and snap is None and backlog is None


def test_a_large_flush_leaves_nothing_persisted_in_memory(engine: Engine) -> None:
    from engine.writequeue import KEEP_ITEMS

    engine.write_batch([WriteOp(Op.MUTATION, f"k{i}", b"v") for i in range(KEEP_ITEMS + 1)])
    engine.flush_now()
    assert engine.memory_snapshot(0, 0) is None and engine.memory_backlog(0, 0) is None
    root = engine._parts[0].queue.root
    assert len(root.vec) == 0 and root.base == KEEP_ITEMS + 2


def summarize(out: list[Marker | Batch]) -> list[Any]:
    return [("marker", x.start, x.end, x.source) if isinstance(x, Marker)
            else ("batch", list(decode_binary(x.data).seqnos), x.last) for x in out]  # type: ignore[arg-type]


def test_inline_pass_stops_where_memory_no_longer_covers_and_the_thread_path_finishes(tmp_path: Path) -> None:
    eng = Engine.open(EngineConfig(data_dir=tmp_path / "data", partitions=2, flush_interval_ms=60_000))
    try:
        keys = {0: [], 1: []}  # type: dict[int, list[str]]
        i = 0
        while min(len(v) for v in keys.values()) < 4:
            key = f"k{i}"
            keys[eng.partition_of(key)].append(key)
            i += 1
        for p in (0, 1):
            for key in keys[p][:3]:
                eng.write(WriteOp(Op.MUTATION, key, b"v"))
        eng.flush_now()
        for p in (0, 1):
            eng.write(WriteOp(Op.MUTATION, keys[p][3], b"v"))
        eng.flush_now()  # a second flush: partition 0's position 0 now needs a disk part

        def memory_only(p: int, after: int) -> Any:
            snap = eng.memory_snapshot(p, after)
            if snap is None:
                raise _NotInMemory(p)
            return snap

        first, second = PartitionCursor(0, 0, 0), PartitionCursor(1, 0, 0)
        results = _produce_many([first, second], (memory_only, encode_binary_columns), 1 << 20)
        assert results == [([], False, None)]  # stopped at the first cursor; the second gets nothing yet
        assert not first.holding and first.last_seqno == 0
        out: list[Marker | Batch] = []
        while not first.produce(eng.snapshot, encode_binary_columns, 1 << 20, out):
            pass
        assert summarize(out) == [("marker", 1, 4, "disk"), ("batch", [1, 2, 3, 4], True)]
    finally:
        eng.close()


@pytest.mark.parametrize(("partition", "start", "end", "source", "purge"), [
    (0, 1, 1, "memory", 0), (1023, 6, 9_007_199_254_740_991, "disk", 5), (7, 0, 0, "memory", 123456789),
])
def test_marker_text_is_the_protocol_encoding(partition: int, start: int, end: int, source: str, purge: int) -> None:
    from app.stream.cursor import marker_text
    from engine.protocol import messages as M

    expected = M.encode(M.SnapshotMarker(partition, start, end, M.SnapshotSource(source), purge))
    assert marker_text(partition, start, end, source, purge) == expected
    assert M.decode(expected, sender=M.Sender.SERVER) == M.SnapshotMarker(partition, start, end,
                                                                            M.SnapshotSource(source), purge)


@pytest.mark.parametrize("msg", [M.CycleComplete(0), M.CycleComplete(123456789), M.BarrierReachedMessage("c", {1: 2}),
                                 M.StreamEndMessage(3, M.StreamEndReason.CLOSED, 7)])
def test_control_text_is_the_protocol_encoding(msg: object) -> None:
    from app.stream.outbox import control_text

    assert control_text(msg) == M.encode(msg)


@pytest.mark.parametrize("seed", range(4))
def test_memory_snapshot_matches_the_engines_at_every_position_of_a_random_history(engine: Engine, seed: int) -> None:
    import random

    rng = random.Random(seed)
    for _ in range(60):
        if rng.random() < 0.25:
            engine.flush_now()
        else:
            key = f"k{rng.randrange(6)}"
            try:
                engine.write(WriteOp(Op.DELETION if rng.random() < 0.15 else Op.MUTATION, key, b"v"))
            except KeyNotFound:  # deleting a key that is not there writes nothing
                pass
        high = engine.high_seqno(0)
        for after in range(high + 1):
            snap = engine.memory_snapshot(0, after)
            with engine.snapshot(0, after) as reference:
                expected = shape(reference)
            if snap is None:
                assert engine.memory_backlog(0, after) is None
                assert any(p[0] == "disk" for p in expected[2])
                continue
            got = shape(snap)
            assert got[:2] == expected[:2]
            assert latest(got) == latest(expected)
            assert [item for part in got[2] for item in part[3]] == latest(got)  # each key once
