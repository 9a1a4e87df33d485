"""``SnapshotPart.columns()`` yields exactly what ``batches()`` yields (same items, same cuts),
and the column encoders produce the same frames as the item encoders."""
from __future__ import annotations

import pytest

from engine.protocol.frames import (
    Columns,
    decode_binary,
    encode_binary,
    encode_binary_columns,
    encode_json,
    encode_json_columns,
)
from engine.core.types import Item, Op, WriteOp

SLOW_FLUSH = {"flush_interval_ms": 60_000.0}


def load(engine) -> None:
    """Disk part with rewrites, deletes and uneven values; memory part with rewrites of it."""
    engine.write_batch([WriteOp(Op.MUTATION, f"k{i}", b"v" * (i % 300)) for i in range(2500)])
    engine.write_batch([WriteOp(Op.DELETION, f"k{i}") for i in range(0, 2500, 5)])
    engine.write_batch([WriteOp(Op.MUTATION, f"k{i}", b"again") for i in range(1, 2500, 9)])
    engine.flush_now()
    engine.write_batch([WriteOp(Op.MUTATION, f"k{i}", b"mem") for i in range(0, 2500, 4)])
    engine.write_batch([WriteOp(Op.MUTATION, f"ключ{i}", b"") for i in range(50)])


@pytest.mark.parametrize("max_items, max_bytes", [(1000, 1 << 20), (7, 1 << 20), (1000, 500), (3, 1), (1, 1 << 20)])
@pytest.mark.parametrize("after", [0, 1, 1700, 2900])
def test_columns_match_batches(make_engine, max_items, max_bytes, after) -> None:
    engine = make_engine(partitions=2, **SLOW_FLUSH)
    load(engine)
    for p in range(2):
        with engine.snapshot(p, min(after, engine.high_seqno(p))) as s1, \
                engine.snapshot(p, min(after, engine.high_seqno(p))) as s2:
            assert [x.source for x in s1.parts] == [x.source for x in s2.parts]
            for a, b in zip(s1.parts, s2.parts):
                batches = list(a.batches(max_items, max_bytes))
                columns = list(b.columns(max_items, max_bytes))
                assert [len(c) for c in columns] == [len(x) for x in batches]
                assert all(len(c) for c in columns)
                for items, cols in zip(batches, columns):
                    assert list(cols) == items
                    assert cols.last_seqno == items[-1].seqno
                    for last in (False, True):
                        assert encode_binary_columns(p, cols, last) == encode_binary(p, items, last)
                        assert encode_json_columns(p, cols, last) == encode_json(p, items, last)


def test_disk_columns_release_the_read_transaction(make_engine) -> None:
    engine = make_engine(partitions=1, **SLOW_FLUSH)
    load(engine)
    snap = engine.snapshot(0, 0)
    disk = snap.parts[0]
    assert disk.source == "disk"
    it = disk.columns(10)
    next(it)
    it.close()  # closing the generator early releases the transaction
    assert not disk._reader._read._open
    snap.close()


def test_columns_rejects_bad_max_items(make_engine) -> None:
    engine = make_engine(partitions=1)
    engine.write_batch([WriteOp(Op.MUTATION, "k", b"v")])
    with engine.snapshot(0, 0) as snap, pytest.raises(ValueError):
        snap.parts[0].columns(0)


def test_empty_and_of_items_columns_encode_like_items() -> None:
    items = [Item(b"a", 1, 2, 3, False, b"x"), Item("é".encode(), 2, 5, 4, True, b"")]
    for sample in ([], items):
        cols = Columns.of_items(sample)
        assert len(cols) == len(sample) and list(cols) == sample
        assert encode_binary_columns(9, cols, True) == encode_binary(9, sample, True)
        assert encode_json_columns(9, cols, False) == encode_json(9, sample, False)
        assert list(decode_binary(encode_binary_columns(9, cols, True)).items()) == sample
    assert Columns.of_items([]).last_seqno is None


@pytest.mark.parametrize("max_items, max_bytes", [(1000, 1 << 20), (7, 1 << 20), (1000, 500), (3, 1), (1, 1 << 20)])
@pytest.mark.parametrize("after", [0, 1, 1700, 2900, 10_000])
def test_memory_frame_is_the_memory_snapshots_one_batch_or_none(make_engine, max_items, max_bytes, after) -> None:
    """``Engine.memory_frame`` answers exactly when ``memory_snapshot`` is one memory part of one
    batch, with that batch's items, the snapshot's high seqno and purge seqno."""
    engine = make_engine(partitions=2, **SLOW_FLUSH)
    load(engine)
    for p in range(2):
        for a in {min(after, engine.high_seqno(p)), engine.high_seqno(p) - 1, engine.high_seqno(p) - 5}:
            got = engine.memory_frame(p, a, 10_000, max_items, max_bytes)
            snap = engine.memory_snapshot(p, a)
            batches = [] if snap is None or len(snap.parts) != 1 else list(snap.parts[0].columns(max_items, max_bytes))
            if len(batches) != 1:
                assert got is None
                continue
            assert got is not None
            high, purge, cols = got
            assert (high, purge) == (snap.high_seqno, snap.purge_seqno)
            assert list(cols) == list(batches[0])
            assert engine.memory_frame(p, a, high - a - 1, max_items, max_bytes) is None  # backlog over the limit
