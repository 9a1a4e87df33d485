"""The adapter's side of ``visibility``: ``PartitionCursor`` cut at a visible ceiling over a real
engine (LMDB in a tmp dir, flusher slowed to a minute so the test decides what is persisted),
and ``VisibleCeilings`` waking capped connections from flusher rounds and node reports."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.stream.ceilings import VisibleCeilings
from app.stream.cursor import Batch, Marker, PartitionCursor
from app.stream.tailcache import TailCache
from engine.config import EngineConfig
from engine.core.types import Op, WriteOp
from engine.engine import Engine
from engine.protocol.frames import decode_binary, encode_binary_columns
from engine.protocol.messages import Visibility


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    eng = Engine.open(EngineConfig(data_dir=tmp_path / "data", partitions=2, flush_interval_ms=60_000))
    yield eng
    eng.close()


def put(engine: Engine, key: str) -> None:
    engine.write(WriteOp(Op.MUTATION, key, b"v" * 50))


def keys_of(engine: Engine, partition: int, n: int, prefix: str) -> list[str]:
    from engine.core.keys import partition_for_key

    out, i = [], 0
    while len(out) < n:
        key = f"{prefix}{i}"
        if partition_for_key(key.encode(), engine.num_partitions) == partition:
            out.append(key)
        i += 1
    return out


def produce(cursor: PartitionCursor, engine: Engine, **kw: Any) -> list[Any]:
    out: list[Marker | Batch] = []
    while not cursor.produce(engine.snapshot, encode_binary_columns, 1 << 30, out, ceiling_of=engine.persisted_seqno,
                             **kw):
        pass
    rows: list[Any] = []
    for x in out:
        if isinstance(x, Marker):
            rows.append(("marker", x.start, x.end, x.source))
        else:
            rows.append(("batch", list(decode_binary(x.data).seqnos), x.last))  # type: ignore[arg-type]
    return rows


def test_a_capped_cursor_sends_the_persisted_part_and_pins_the_memory_part_until_the_ceiling_reaches_it(
    engine: Engine,
) -> None:
    keys = keys_of(engine, 0, 5, "k")
    for key in keys:
        put(engine, key)
    engine.flush_now()
    put(engine, keys[1])  # seqno 6, in memory only
    cursor = PartitionCursor(0, 0, 0)
    # the disk part is the state at the persisted seqno: the rewrite of seqno 2 is not on disk yet
    assert produce(cursor, engine) == [("marker", 1, 5, "disk"), ("batch", [1, 2, 3, 4, 5], True)]
    assert (cursor.ceiling, cursor.held_back_to, cursor.last_seqno, cursor.holding) == (5, 6, 5, True)
    assert produce(cursor, engine) == []  # a later visit, ceiling unchanged: still pinned
    assert (cursor.held_back_to, cursor.holding) == (6, True)

    engine.flush_now()
    assert produce(cursor, engine, high_of=engine.high_seqno) == [("marker", 6, 6, "memory"), ("batch", [6], True)]
    assert (cursor.ceiling, cursor.held_back_to, cursor.holding) == (6, None, False)


def test_a_pinned_reading_sent_later_reports_what_was_written_since_as_held(engine: Engine) -> None:
    keys = keys_of(engine, 0, 3, "k")
    put(engine, keys[0])
    cursor = PartitionCursor(0, 0, 0)
    assert produce(cursor, engine) == []
    assert (cursor.held_back_to, cursor.holding) == (1, True)
    engine.flush_now()
    put(engine, keys[1])  # seqno 2: after the pinned reading, maybe before a cookie
    # the pinned reading goes, but this visit's reading (for cookies) ends at the high seqno now
    assert produce(cursor, engine, high_of=engine.high_seqno) == [("marker", 1, 1, "memory"), ("batch", [1], True)]
    assert (cursor.held_back_to, cursor.holding) == (2, False)


def test_a_pinned_reading_released_after_too_long_is_read_afresh(engine: Engine) -> None:
    keys = keys_of(engine, 0, 3, "k")
    put(engine, keys[0])
    cursor = PartitionCursor(0, 0, 0)
    produce(cursor, engine)
    assert cursor.held_since is not None and cursor.release_held()
    assert (cursor.holding, cursor.held_since, cursor.drops) == (False, None, 0)
    assert not cursor.release_held()
    put(engine, keys[1])
    engine.flush_now()
    assert produce(cursor, engine) == [("marker", 1, 2, "disk"), ("batch", [1, 2], True)]


def test_nothing_persisted_past_the_position_sends_nothing(engine: Engine) -> None:
    put(engine, keys_of(engine, 0, 1, "k")[0])
    cursor = PartitionCursor(0, 0, 0)
    assert produce(cursor, engine) == []
    assert (cursor.ceiling, cursor.held_back_to, cursor.last_seqno) == (0, 1, 0)


def test_the_tail_cache_replays_only_up_to_the_ceiling(engine: Engine) -> None:
    cache = TailCache()
    keys = keys_of(engine, 0, 3, "k")
    put(engine, keys[0])
    engine.flush_now()
    put(engine, keys[1])
    uncapped = PartitionCursor(0, 0, 0, tailing=True)
    out: list[Any] = []
    while not uncapped.produce(engine.snapshot, encode_binary_columns, 1 << 30, out, cache, "binary",
                               engine.high_seqno):
        pass
    assert [(m.start, m.end) for m in out if isinstance(m, Marker)] == [(1, 1), (2, 2)]  # both cached
    capped = PartitionCursor(0, 0, 0, tailing=True)
    rows = produce(capped, engine, cache=cache, codec="binary", high_of=engine.high_seqno)
    assert rows == [("marker", 1, 1, "disk"), ("batch", [1], True)]
    assert capped.held_back_to == 2


async def test_flusher_rounds_wake_capped_subscribers_on_the_loop(engine: Engine) -> None:
    loop = asyncio.get_running_loop()
    ceilings = VisibleCeilings(engine, loop)
    woken: list[frozenset[int]] = []
    got = asyncio.Event()

    class Subscriber:
        def ceiling_advanced(self, partitions: frozenset[int]) -> None:
            woken.append(partitions)
            got.set()

    sub = Subscriber()
    put(engine, keys_of(engine, 1, 1, "k")[0])
    await loop.run_in_executor(None, engine.flush_now)
    await asyncio.sleep(0.05)
    assert woken == []  # nobody capped: the persist listener is not even registered
    ceilings.subscribe(sub)
    put(engine, keys_of(engine, 1, 1, "j")[0])
    await loop.run_in_executor(None, engine.flush_now)
    await asyncio.wait_for(got.wait(), 10)
    assert woken == [frozenset({1})]
    ceilings.unsubscribe(sub)
    ceilings.close()


async def test_node_reported_advances_wake_subscribers_and_providers_are_per_visibility(engine: Engine) -> None:
    ceilings = VisibleCeilings(engine, asyncio.get_running_loop())
    assert ceilings.provider(Visibility.MEMORY) is None
    assert ceilings.provider(Visibility.PERSISTED) == engine.persisted_seqno
    assert ceilings.provider(Visibility.MAJORITY) is None  # a single node: nothing to wait for
    ceilings.set_provider(Visibility.MAJORITY, lambda p: 7)
    assert ceilings.provider(Visibility.MAJORITY)(0) == 7  # type: ignore[misc]
    with pytest.raises(ValueError):
        ceilings.set_provider(Visibility.MEMORY, lambda p: 0)
    got: asyncio.Queue[frozenset[int]] = asyncio.Queue()

    class Subscriber:
        def ceiling_advanced(self, partitions: frozenset[int]) -> None:
            got.put_nowait(partitions)

    ceilings.subscribe(Subscriber())
    await asyncio.get_running_loop().run_in_executor(None, ceilings.advanced, 0)  # from any thread
    assert await asyncio.wait_for(got.get(), 10) == frozenset({0})
    ceilings.close()


def test_a_trailing_ceiling_still_gets_the_pinned_reading_while_newer_readings_would_not_fit(
    engine: Engine,
) -> None:
    """A majority trailing the local flush: every fresh reading's disk part ends above it, so only
    a reading kept until the ceiling reaches it ever goes (re-reading would starve the stream)."""
    keys = keys_of(engine, 0, 20, "k")
    ceiling = {0: 0}
    for key in keys[:5]:
        put(engine, key)
    engine.flush_now()  # persisted 5, the majority at 3
    ceiling[0] = 3
    cursor = PartitionCursor(0, 0, 0)
    out: list[Any] = []
    assert cursor.produce(engine.snapshot, encode_binary_columns, 1 << 30, out, None, "", engine.high_seqno,
                          ceiling.get)
    assert out == [] and cursor.held_back_to == 5
    for key in keys[5:10]:
        put(engine, key)
    engine.flush_now()  # persisted 10; the majority reaches 5, the end of the pinned reading
    ceiling[0] = 5
    assert cursor.produce(engine.snapshot, encode_binary_columns, 1 << 30, out, None, "", engine.high_seqno,
                          ceiling.get)
    markers = [(m.start, m.end) for m in out if isinstance(m, Marker)]
    assert markers == [(1, 5)] and cursor.last_seqno == 5
    assert cursor.held_back_to == 10  # written since the pinned reading: the next visit's business
