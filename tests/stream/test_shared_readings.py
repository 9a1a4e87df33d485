"""``SharedReadings`` on a real engine: one encoding per partition change for every connection at
the same position, the same bytes a connection's own visit would send, never a stale reading."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.stream.cursor import Batch, Marker, PartitionCursor
from app.stream.passes import ENCODERS
from app.stream.shared import SharedReadings
from app.stream.tailcache import TailCache
from engine.config import EngineConfig
from engine.core.types import Op, PartitionState, WriteOp
from engine.engine import Engine
from engine.protocol.bundle import decode_bundle
from engine.protocol.shared_pass import BatchStep, MarkerStep

ACTIVE = PartitionState.ACTIVE


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    eng = Engine.open(EngineConfig(data_dir=tmp_path / "data", partitions=1, flush_interval_ms=60_000))
    yield eng
    eng.close()


def put(engine: Engine, key: str) -> None:
    engine.write(WriteOp(Op.MUTATION, key, b"v" * 100))


def own_visit(engine: Engine, codec: str, after: int) -> list[str | bytes]:
    """The messages a connection's own visit from ``after`` sends (the usual path)."""
    out: list[Marker | Batch] = []
    assert PartitionCursor(0, after, after).produce(engine.snapshot, ENCODERS[codec], 1 << 30, out)
    return [x.text if isinstance(x, Marker) else x.data for x in out]


def bundle_parts(parts: bytes, count: int) -> list[str | bytes]:
    header = b"UPRM\x01\x00\x00\x00" + count.to_bytes(4, "little") + b"\x00" * 4
    return decode_bundle(header + parts)


@pytest.mark.parametrize("codec", ["binary", "json"])
def test_connections_at_one_position_share_one_reading_of_the_bytes_their_own_visit_sends(
        engine: Engine, codec: str) -> None:
    shared = SharedReadings(engine, ENCODERS, TailCache())
    for i in range(3):
        put(engine, f"k{i}")
    first = shared.reading(codec, 0, 0, ACTIVE)
    assert first is not None and shared.reads == 1
    assert [shared.reading(codec, 0, 0, ACTIVE) for _ in range(49)] == [first] * 49
    assert shared.reads == 1 and shared.hits == 49
    assert all(shared.reading(codec, 0, 0, ACTIVE) is first for _ in range(3))
    assert first.end == 3 and first.steps == (MarkerStep(1, 3, 0), BatchStep(3, True))
    assert bundle_parts(first.parts, first.count) == own_visit(engine, codec, 0)
    assert first.size == sum(len(x) for x in own_visit(engine, codec, 0))


def test_a_write_makes_the_reading_stale_and_the_next_asker_reads_again(engine: Engine) -> None:
    shared = SharedReadings(engine, ENCODERS)
    put(engine, "a")
    old = shared.reading("binary", 0, 0, ACTIVE)
    put(engine, "b")
    new = shared.reading("binary", 0, 0, ACTIVE)
    assert old is not None and new is not None and new is not old
    assert (old.end, new.end) == (1, 2) and shared.reads == 2
    assert shared.reading("binary", 0, 2, ACTIVE) is not None
    assert shared.reading("binary", 0, 2, ACTIVE).steps == ()  # type: ignore[union-attr]  # idle: nothing new


def test_no_reading_when_it_needs_the_disk_is_too_large_or_the_state_changed(engine: Engine) -> None:
    shared = SharedReadings(engine, ENCODERS, max_items=4)
    for i in range(3):
        put(engine, f"k{i}")
    engine.flush_now()
    put(engine, "m")
    assert shared.reading("binary", 0, 0, ACTIVE) is None  # seqnos 1..3 are only on disk now
    assert shared.reading("binary", 0, 3, ACTIVE) is not None
    for i in range(5):
        put(engine, f"n{i}")
    assert shared.reading("binary", 0, 3, ACTIVE) is None  # 6 items: more than max_items
    assert shared.reading("binary", 0, 3, PartitionState.REPLICA) is None


def test_bounded_by_bytes(engine: Engine) -> None:
    shared = SharedReadings(engine, ENCODERS, max_bytes=1000)
    for i in range(20):
        put(engine, f"k{i}")
        assert shared.reading("binary", 0, i, ACTIVE) is not None
    assert shared.bytes <= 1000 and len(shared) < 20


async def test_a_position_the_flusher_passed_gets_one_disk_reading_for_every_connection(engine: Engine) -> None:
    import asyncio

    shared = SharedReadings(engine, ENCODERS, TailCache())
    for i in range(3):
        put(engine, f"k{i}")
    engine.flush_now()
    put(engine, "m")
    assert shared.reading("binary", 0, 0, ACTIVE) is None and shared.may_read(0, 0)
    jobs = 0

    async def run(fn: Any, *args: Any) -> Any:
        nonlocal jobs
        jobs += 1
        return await asyncio.to_thread(fn, *args)

    got = await asyncio.gather(*(shared.read("binary", 0, 0, ACTIVE, run) for _ in range(20)))
    assert jobs == 1 and all(r is got[0] for r in got) and got[0] is not None
    first = got[0]
    assert first.end == 4 and shared.current(first, ACTIVE)
    assert bundle_parts(first.parts, first.count) == own_visit(engine, "binary", 0)
    assert shared.reading("binary", 0, 0, ACTIVE) is first  # kept: later askers need no reader hop
    put(engine, "n")
    assert not shared.current(first, ACTIVE)


async def test_no_disk_reading_when_it_is_larger_than_its_budget(engine: Engine) -> None:
    import asyncio

    shared = SharedReadings(engine, ENCODERS, disk_budget=500)
    for i in range(10):
        put(engine, f"k{i}")
    engine.flush_now()
    assert await shared.read("binary", 0, 0, ACTIVE, lambda fn, *a: asyncio.to_thread(fn, *a)) is None
    assert len(shared) == 0


@pytest.mark.parametrize("codec", ["binary", "json"])
@pytest.mark.parametrize("writes", [
    [("a", 10)],
    [("a", 10), ("b", 50), ("c", 0)],
    [("a", 10), ("a", 20), ("b", 5), ("a", 7)],  # rewritten keys: the memory part is deduplicated
    [("a", 10), ("-a", 0), ("b", 5)],  # a deletion
    [("big", 70_000), ("b", 5)],  # two frames: the general reading takes it
    [(f"k{i}", 20) for i in range(5000)],  # more items than one frame holds
    [("a", 10), ("big", 70_000)],  # the last item reaches the frame's bytes: still one frame
    [(f"k{i}", i) for i in range(40)],  # more items than the small-batch packing takes
])
def test_a_one_frame_reading_is_the_cursors_reading_part_for_part(
        engine: Engine, codec: str, writes: list[tuple[str, int]]) -> None:
    for key, size in writes:
        if key.startswith("-"):
            engine.write(WriteOp(Op.DELETION, key[1:], b""))
        else:
            engine.write(WriteOp(Op.MUTATION, key, b"v" * size))
    fast_cache, usual_cache = TailCache(), TailCache()
    fast = SharedReadings(engine, ENCODERS, fast_cache, max_items=10_000)
    usual = SharedReadings(engine, ENCODERS, usual_cache, max_items=10_000)
    got = fast._read(codec, 0, 0)  # noqa: SLF001 - the two paths compared
    snap = engine.memory_snapshot(0, 0)
    want = usual._encode(codec, 0, 0, snap, 1 << 30)  # noqa: SLF001
    assert got is not None and want is not None
    assert (got.partition, got.after, got.end, got.steps, got.parts, got.count, got.size) == (
        want.partition, want.after, want.end, want.steps, want.parts, want.count, want.size)
    assert bundle_parts(got.parts, got.count) == own_visit(engine, codec, 0)
    cached, expected = fast_cache.get(codec, 0, 0), usual_cache.get(codec, 0, 0)
    assert cached is not None and expected is not None
    assert (cached.after, cached.end, cached.size) == (expected.after, expected.end, expected.size)
    assert [(type(x), x.text if isinstance(x, Marker) else (x.data, x.last_seqno, x.last)) for x in cached.outputs] \
        == [(type(x), x.text if isinstance(x, Marker) else (x.data, x.last_seqno, x.last)) for x in expected.outputs]
