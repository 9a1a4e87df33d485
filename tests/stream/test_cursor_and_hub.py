"""The stream adapter's engine-facing parts without a server: ``PartitionCursor`` over a real
engine (LMDB in a tmp dir) and ``ChangeHub`` coalescing notifications from a writer thread."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.stream.cursor import Batch, Marker, PartitionCursor
from app.stream.hub import ChangeHub
from engine.config import EngineConfig
from engine.engine import Engine
from engine.protocol.frames import Columns, decode_binary, encode_binary_columns
from engine.core.types import Item, Op, WriteOp


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    eng = Engine.open(EngineConfig(data_dir=tmp_path / "data", partitions=1, flush_interval_ms=60_000))
    yield eng
    eng.close()


def put(engine: Engine, key: str, value: bytes = b"v" * 100) -> None:
    engine.write(WriteOp(Op.MUTATION, key, value))


def drain(cursor: PartitionCursor, engine: Engine, budget: int = 1 << 30) -> list[Marker | Batch]:
    out: list[Marker | Batch] = []
    while not cursor.produce(engine.snapshot, encode_binary_columns, budget, out):
        pass
    return out


def summarize(out: list[Marker | Batch]) -> list[Any]:
    rows: list[Any] = []
    for x in out:
        if isinstance(x, Marker):
            rows.append(("marker", x.start, x.end, x.source))
        else:
            batch = decode_binary(x.data)  # type: ignore[arg-type]
            rows.append(("batch", list(batch.seqnos), batch.last))
    return rows


def test_idle_partition_produces_nothing(engine: Engine) -> None:
    cursor = PartitionCursor(0, 0, 0)
    assert cursor.produce(engine.snapshot, encode_binary_columns, 1 << 20, out := []) and out == []
    assert not cursor.holding


def test_disk_then_memory_part_each_with_marker_and_last_batch(engine: Engine) -> None:
    for i in range(5):
        put(engine, f"k{i}")
    engine.flush_now()
    put(engine, "k1")  # seqno 6, in memory only
    put(engine, "k9")  # seqno 7
    out = drain(PartitionCursor(0, 0, 0), engine)
    assert summarize(out) == [
        ("marker", 1, 5, "disk"), ("batch", [1, 2, 3, 4, 5], True),
        ("marker", 6, 7, "memory"), ("batch", [6, 7], True),
    ]


def test_budget_bounds_each_job_and_the_position_follows(engine: Engine) -> None:
    for i in range(300):
        put(engine, f"k{i}", b"x" * 1000)
    engine.flush_now()
    cursor = PartitionCursor(0, 0, 0, frame_bytes=10_000)
    jobs = []
    while True:
        out: list[Marker | Batch] = []
        done = cursor.produce(engine.snapshot, encode_binary_columns, 30_000, out)
        jobs.append(out)
        if done:
            break
    assert len(jobs) >= 8
    for out in jobs:  # at most one frame beyond the budget
        assert sum(len(x.data) for x in out if isinstance(x, Batch)) < 30_000 + 12_000
    seqnos = [s for out in jobs for row in summarize(out) if row[0] == "batch" for s in row[1]]
    assert seqnos == list(range(1, 301))
    assert cursor.last_seqno == 300 and not cursor.holding


def test_dropped_cursor_rereads_and_continues_the_open_snapshot(engine: Engine) -> None:
    for i in range(200):
        put(engine, f"k{i}", b"x" * 1000)
    engine.flush_now()
    cursor = PartitionCursor(0, 0, 0, frame_bytes=20_000)
    first: list[Marker | Batch] = []
    assert not cursor.produce(engine.snapshot, encode_binary_columns, 40_000, first)
    assert cursor.holding and cursor.open_snapshot
    seen = cursor.last_seqno
    assert cursor.drop() and not cursor.holding and cursor.drops == 1
    for i in range(0, 200, 2):
        put(engine, f"k{i}", b"new")  # newer versions of half the keys, some already sent
    engine.flush_now()  # ... and persisted: the re-read comes from disk
    rest = drain(cursor, engine)
    rows = summarize(first) + summarize(rest)
    markers = [r for r in rows if r[0] == "marker"]
    assert markers[0] == ("marker", 1, 200, "disk")
    assert markers[1] == ("marker", seen + 1, 300, "disk")  # continuation: the rest, to the new end
    assert len(markers) == 2
    after = [s for r in summarize(rest) if r[0] == "batch" for s in r[1]]
    assert after and min(after) > seen  # nothing already sent comes again
    # the union is the partition's current state
    latest: dict[bytes, bytes] = {}
    for out in (first, rest):
        for x in out:
            if isinstance(x, Batch):
                b = decode_binary(x.data)  # type: ignore[arg-type]
                latest.update(zip(b.keys, b.values))
    assert len(latest) == 200
    assert all(latest[f"k{i}".encode()] == (b"new" if i % 2 == 0 else b"x" * 1000) for i in range(200))


@dataclass
class FakePart:
    source: str
    start: int
    end: int
    items: list[Item] = field(default_factory=list)

    def columns(self, max_items: int, max_bytes: int) -> Any:
        return iter([Columns.of_items(self.items)] if self.items else [])


@dataclass
class FakeSnapshot:
    parts: list[FakePart]
    high_seqno: int = 0
    purge_seqno: int = 3


def test_part_with_nothing_left_still_gets_a_marker_and_an_empty_last_batch() -> None:
    snap = FakeSnapshot([FakePart("disk", 1, 5), FakePart("memory", 6, 6, [Item(b"k", 6, 1, 1, False, b"v")])], 6)
    cursor = PartitionCursor(0, 0, 0)
    out: list[Marker | Batch] = []
    assert cursor.produce(lambda p, after: snap, encode_binary_columns, 1 << 20, out)
    assert summarize(out) == [("marker", 1, 5, "disk"), ("batch", [], True), ("marker", 6, 6, "memory"),
                              ("batch", [6], True)]
    assert [x.purge_seqno for x in out if isinstance(x, Marker)] == [3, 3]
    assert cursor.last_seqno == 6


async def test_hub_coalesces_a_busy_writer_into_few_loop_callbacks() -> None:
    listeners: list[Any] = []

    def add_listener(cb: Any) -> Any:
        listeners.append(cb)
        return lambda: listeners.remove(cb)

    hub = ChangeHub(add_listener, asyncio.get_running_loop())
    got: list[frozenset[int]] = []

    class Sub:
        def notify(self, partitions: frozenset[int]) -> None:
            got.append(partitions)

    hub.subscribe(Sub())

    def writer() -> None:
        for i in range(20_000):
            listeners[0](i % 7)

    thread = threading.Thread(target=writer)
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(0.001)
    thread.join()
    await asyncio.sleep(0.01)
    assert set().union(*got) == set(range(7))
    assert len(got) < 2_000  # coalesced: far fewer loop callbacks than notifications
    hub.close()
    assert listeners == []


async def test_a_batch_listening_hub_delivers_a_writes_partitions_together() -> None:
    """With ``batch_listener`` each write's partitions are marked at once: the loop's delivery
    never carries part of a write, even while the writer thread keeps writing."""
    listeners: list[Any] = []

    def add_listener(cb: Any, batch: bool = False) -> Any:
        assert batch
        listeners.append(cb)
        return lambda: listeners.remove(cb)

    hub = ChangeHub(add_listener, asyncio.get_running_loop(), batch_listener=True)
    got: list[frozenset[int]] = []

    class Sub:
        def notify(self, partitions: frozenset[int]) -> None:
            got.append(partitions)

    hub.subscribe(Sub())
    writes = [tuple(range(w % 5, 64, 5)) for w in range(300)]  # each write touches 12-13 partitions

    def writer() -> None:
        for partitions in writes:
            listeners[0](partitions)

    thread = threading.Thread(target=writer)
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(0)
    thread.join()
    await asyncio.sleep(0.01)
    assert set().union(*got) == set(range(64))
    for delivery in got:  # a union of whole writes
        assert all(set(w) <= delivery for w in writes if set(w) & delivery)
    hub.close()
    assert listeners == []


def ten_on_disk_five_in_memory(engine: Engine) -> None:
    """Seqnos 1..10 persisted, 11..15 only in the write queue's memory (partition 0)."""
    for i in range(10):
        put(engine, f"k{i}")
    engine.flush_now()
    for i in range(5):
        put(engine, f"m{i}")


def test_tail_cache_replays_a_memory_snapshot_to_a_cursor_at_the_same_position(engine: Engine) -> None:
    from app.stream.tailcache import TailCache

    cache = TailCache()
    ten_on_disk_five_in_memory(engine)
    first = PartitionCursor(0, 10, 10)
    out1: list[Marker | Batch] = []
    assert first.produce(engine.snapshot, encode_binary_columns, 1 << 20, out1, cache, "binary", engine.high_seqno)
    assert summarize(out1) == [("marker", 11, 15, "memory"), ("batch", [11, 12, 13, 14, 15], True)]
    assert len(cache) == 1

    snapshots_taken = []

    def counting_snapshot(p: int, after: int) -> Any:
        snapshots_taken.append(after)
        return engine.snapshot(p, after)

    second = PartitionCursor(0, 10, 10, tailing=True)
    out2: list[Marker | Batch] = []
    assert second.produce(counting_snapshot, encode_binary_columns, 1 << 20, out2, cache, "binary", engine.high_seqno)
    assert out2 == out1 and snapshots_taken == []  # replayed, nothing read or encoded again
    assert second.last_seqno == 15 and cache.hits == 1

    put(engine, "m9")  # seqno 16: replay, then a fresh reading after the replayed range
    third = PartitionCursor(0, 10, 10, tailing=True)
    out3: list[Marker | Batch] = []
    assert third.produce(counting_snapshot, encode_binary_columns, 1 << 20, out3, cache, "binary", engine.high_seqno)
    assert summarize(out3) == summarize(out1) + [("marker", 16, 16, "memory"), ("batch", [16], True)]
    assert snapshots_taken == [15]
    # another codec has its own entries
    assert cache.get("json", 0, 10) is None


def test_tail_cache_replays_disk_parts_too_so_lagging_cursors_stay_on_one_chain(engine: Engine) -> None:
    """Fan-out: consumers behind the flusher get a disk part; sharing only memory parts left each
    of them reading and encoding the same disk range itself (most of the server's CPU at 50
    consumers), and their positions drifted apart so memory entries stopped matching too."""
    from app.stream.tailcache import TailCache

    cache = TailCache()
    ten_on_disk_five_in_memory(engine)
    first = PartitionCursor(0, 0, 0)
    out1: list[Marker | Batch] = []
    assert first.produce(engine.snapshot, encode_binary_columns, 1 << 20, out1, cache, "binary", engine.high_seqno)
    assert [x for x in summarize(out1) if x[0] == "marker"] == [("marker", 1, 10, "disk"), ("marker", 11, 15, "memory")]
    assert len(cache) == 2

    def no_snapshot(p: int, after: int) -> Any:
        raise AssertionError(f"read after {after}: should have been replayed")

    second = PartitionCursor(0, 0, 0, tailing=True)
    out2: list[Marker | Batch] = []
    assert second.produce(no_snapshot, encode_binary_columns, 1 << 20, out2, cache, "binary", engine.high_seqno)
    assert out2 == out1 and second.last_seqno == 15 and cache.hits == 2


def test_tail_cache_is_bounded() -> None:
    from app.stream.tailcache import CachedSnapshot, TailCache

    cache = TailCache(max_bytes=10_000, max_entries=3)
    for after in range(10):
        cache.put("binary", 0, CachedSnapshot(after, after + 1, (), 1000))
    assert len(cache) == 3 and cache.bytes == 3000
    assert cache.get("binary", 0, 9) is not None and cache.get("binary", 0, 0) is None
    for after in range(20):
        cache.put("binary", after + 1, CachedSnapshot(after, after + 1, (), 2000))
    assert cache.bytes <= 10_000


def test_continuation_merges_the_new_reading_into_one_snapshot(engine: Engine) -> None:
    for i in range(200):
        put(engine, f"k{i}", b"x" * 1000)
    engine.flush_now()
    cursor = PartitionCursor(0, 0, 0, frame_bytes=20_000)
    first: list[Marker | Batch] = []
    assert not cursor.produce(engine.snapshot, encode_binary_columns, 40_000, first)
    seen = cursor.last_seqno
    cursor.drop()
    for i in range(50):
        put(engine, f"k{i}", b"mem")  # seqnos 201..250, memory only: the re-read has two parts
    rest = drain(cursor, engine)
    rows = summarize(rest)
    assert rows[0] == ("marker", seen + 1, 250, "disk")
    assert [r for r in rows if r[0] == "marker"] == [rows[0]]  # one marker for both parts
    lasts = [r[2] for r in rows if r[0] == "batch"]
    assert lasts[-1] is True and not any(lasts[:-1])  # only the final batch completes it
    seqnos = [s for r in rows if r[0] == "batch" for s in r[1]]
    assert seqnos == sorted(seqnos) and seqnos[-1] == 250
    # a second drop during the continuation announces a new continuation that ends no earlier
    cursor2 = PartitionCursor(0, 0, 0, frame_bytes=20_000)
    out: list[Marker | Batch] = []
    cursor2.produce(engine.snapshot, encode_binary_columns, 40_000, out)
    cursor2.drop()
    out2: list[Marker | Batch] = []
    cursor2.produce(engine.snapshot, encode_binary_columns, 40_000, out2)
    at = cursor2.last_seqno
    cursor2.drop()
    put(engine, "late", b"z")
    out3 = drain(cursor2, engine)
    assert at < 200 and summarize(out3)[0] == ("marker", at + 1, 251, "disk")
    assert [r for r in summarize(out3) if r[0] == "batch"][-1][2] is True


async def test_job_batcher_runs_queued_jobs_in_one_hop_in_order() -> None:
    from app.stream.jobs import JobBatcher

    hops: list[int] = []

    async def submit(fn: Any, jobs: Any) -> Any:
        hops.append(len(jobs))
        return await asyncio.to_thread(fn, jobs)

    batcher = JobBatcher(submit, max_in_flight=1)
    order: list[int] = []

    def job(i: int) -> int:
        order.append(i)
        if i == 3:
            raise ValueError("job 3 fails alone")
        return i * 10

    futures = [batcher.run(job, i) for i in range(6)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert results[:3] == [0, 10, 20] and isinstance(results[3], ValueError) and results[4:] == [40, 50]
    assert order == list(range(6))
    assert sum(hops) == 6 and len(hops) <= 2  # the first job alone, then everything queued meanwhile


def test_a_new_stream_reads_fresh_even_where_the_tail_cache_has_its_position(engine: Engine) -> None:
    """The first reading of a stream is the state as of now (deduplicated), not an old encoded
    snapshot of its start position plus everything since: a key rewritten meanwhile comes once."""
    from app.stream.tailcache import TailCache

    cache = TailCache()
    put(engine, "k", b"old")
    engine.flush_now()
    tail = PartitionCursor(0, 0, 0)
    assert tail.produce(engine.snapshot, encode_binary_columns, 1 << 20, [], cache, "binary", engine.high_seqno)
    assert cache.get("binary", 0, 0) is not None  # (0, 1] stored
    put(engine, "k", b"new")  # seqno 2 supersedes seqno 1
    engine.flush_now()  # on disk only seqno 2 is left
    fresh = PartitionCursor(0, 0, 0)  # e.g. a full backup run starting from 0
    out: list[Marker | Batch] = []
    assert fresh.produce(engine.snapshot, encode_binary_columns, 1 << 20, out, cache, "binary", engine.high_seqno)
    assert [x for x in summarize(out) if x[0] == "batch"] == [("batch", [2], True)]
    assert fresh.tailing  # later visits may replay what other connections stored
