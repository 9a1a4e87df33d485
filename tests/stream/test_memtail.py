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


# (writes and flushes, position after which the consumer reads, memory-only?)
CASES = [
    ("", 0, True),                             # nothing written: empty, same as the engine's
    ("wa wb wc", 0, True),                     # never flushed: all in memory
    ("wa wb wa wc wa", 0, True),               # rewrites deduplicated exactly as the engine does
    ("wa wb wc f wd we", 3, True),             # flushed up to the position: memory part only
    ("wa wb wc f wd we", 5, True),             # caught up: nothing left
    ("wa wb wc f wd we", 2, False),            # seqno 3 is only on disk now: needs the thread path
    ("wa wb wc f", 0, False),                  # everything persisted, consumer behind
    ("wa wb wc f wa", 3, True),                # a rewrite of a persisted key, in memory
    ("wa wb f wc wd f we", 2, False),          # two flushes past the position
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
    if in_memory:
        assert snap is not None and not has_disk
        assert shape(snap) == expected
        assert backlog == engine.high_seqno(0) - after
    else:
        assert has_disk and snap is None and backlog is None


def summarize(out: list[Marker | Batch]) -> list[Any]:
    return [("marker", x.start, x.end, x.source) if isinstance(x, Marker)
            else ("batch", list(decode_binary(x.data).seqnos), x.last) for x in out]  # type: ignore[arg-type]


def test_inline_pass_stops_where_memory_no_longer_covers_and_the_thread_path_finishes(tmp_path: Path) -> None:
    eng = Engine.open(EngineConfig(data_dir=tmp_path / "data", partitions=2, flush_interval_ms=60_000))
    try:
        keys = {0: [], 1: []}  # type: dict[int, list[str]]
        i = 0
        while min(len(v) for v in keys.values()) < 3:
            key = f"k{i}"
            keys[eng.partition_of(key)].append(key)
            i += 1
        for p in (0, 1):
            for key in keys[p][:3]:
                eng.write(WriteOp(Op.MUTATION, key, b"v"))
        eng.flush_now()  # partition 0's position 0 now needs a disk part

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
        assert summarize(out) == [("marker", 1, 3, "disk"), ("batch", [1, 2, 3], True)]
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
