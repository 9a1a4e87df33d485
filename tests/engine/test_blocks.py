"""Storage format 2 (``engine.storage``): blocks, stale marks and compaction keep Couchstore
semantics: a by-seqno scan yields each live key's latest version once, from any start seqno,
through any number of flushes, rewrites, deletes, compactions and restarts."""
from __future__ import annotations

import random

import lmdb
import pytest

from engine.core.errors import InvalidInput
from engine.core.types import Item, Op, WriteOp
from engine.storage import blocks, compaction, records, stale_marks
from engine.storage.blocks import decode_block, encode_block
from engine.storage.errors import IncompatibleDataDir

SLOW_FLUSH = {"flush_interval_ms": 60_000.0}


def disk_scan(engine, p, after=0, max_items=1000, max_bytes=1 << 20):
    """Items of the disk part only (what is persisted), checked against ``batches()``."""
    with engine.snapshot(p, after) as s1, engine.snapshot(p, after) as s2:
        disk = [x for x in s1.parts if x.source == "disk"]
        twin = [x for x in s2.parts if x.source == "disk"]
        if not disk:
            return []
        cols = [c for c in disk[0].columns(max_items, max_bytes)]
        items = [i for b in twin[0].batches(max_items, max_bytes) for i in b]
    flat = [i for c in cols for i in c]
    assert flat == items
    assert all(0 < len(c) <= max_items for c in cols)
    return flat


def model_scan(model, p, after, partition_of):
    """The model's latest version per key of partition ``p`` after ``after``, in seqno order."""
    items = [it for key, it in model.items() if partition_of(key) == p and it.seqno > after]
    return sorted(items, key=lambda it: it.seqno)


def run_random(engine, seed, rounds, partitions):
    rnd = random.Random(seed)
    model: dict[bytes, Item] = {}
    for _ in range(rounds):
        ops = []
        for _ in range(rnd.randint(1, 60)):
            key = f"k{rnd.randrange(150)}"
            if rnd.random() < 0.2:
                ops.append(WriteOp(Op.DELETION, key))
            else:
                ops.append(WriteOp(Op.MUTATION, key, rnd.randbytes(rnd.choice((0, 1, 5, 300)))))
        for op, res in zip(ops, engine.write_batch(ops)):
            if isinstance(res, Exception):
                continue  # deleting a key that is not there
            model[op.key.encode()] = Item(op.key.encode(), res.seqno, res.cas, res.rev, res.deleted, op.value)
        if rnd.random() < 0.7:
            engine.flush_now()
            check_invariants(engine)
    engine.flush_now()
    return model


def check_invariants(engine) -> None:
    """Every by-key record names a seqno held by exactly one block and not marked stale; every
    stale mark names a seqno some block holds (so a block's marks count its dead items)."""
    s = engine._store
    with s.read_txn() as txn:
        for p in range(s.num_partitions):
            held: list[int] = []
            for _k, blob in txn.cursor(s.block_dbs[p]).iternext():
                held.extend(decode_block(blob)[1])
            assert held == sorted(set(held))
            marks = {int.from_bytes(k, "big") for k in txn.cursor(s.stale_dbs[p]).iternext(values=False)}
            live = [records.META.unpack(v)[0] for v in txn.cursor(s.key_dbs[p]).iternext(keys=False)]
            assert marks <= set(held) and not marks & set(live)
            assert set(live) | marks == set(held)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_history_scans_like_the_model(make_engine, monkeypatch, seed) -> None:
    # small limits so that blocks split, compactions run often and snapshots start mid-block
    monkeypatch.setattr(blocks, "BLOCK_ITEMS", 7)
    monkeypatch.setattr(blocks, "BLOCK_VALUE_BYTES", 900)
    monkeypatch.setattr(compaction, "COMPACT_MIN_STALE", 20)
    monkeypatch.setattr(compaction, "COMPACT_MIN_BLOCKS", 15)
    monkeypatch.setattr(compaction, "COMPACT_STEP_BYTES", 1500)  # passes take several flushes
    monkeypatch.setattr(stale_marks, "MARK_WINDOW", 3)  # stale marks are read in many windows
    engine = make_engine(partitions=3, **SLOW_FLUSH)
    model = run_random(engine, seed, 120, 3)
    check_against_model(engine, model)
    # a full pass that purges nothing, then one that purges the older half of the tombstones
    engine.compact(purge_before_seqno={p: 1 for p in range(3)})
    check_against_model(engine, model)
    bounds = {p: engine.persisted_seqno(p) // 2 for p in range(3)}
    engine.compact(purge_before_seqno=bounds)
    for key, it in list(model.items()):
        if it.deleted and it.seqno < bounds[engine.partition_of(key.decode())]:
            del model[key]
    check_against_model(engine, model)
    check_invariants(engine)
    with engine._store.read_txn() as txn:
        assert all(txn.stat(engine._store.stale_dbs[p])["entries"] == 0 for p in range(3))


def check_against_model(engine, model) -> None:
    for p in range(3):
        high = engine.persisted_seqno(p)
        for after in sorted({0, 1, high // 3, high // 2, high - 1, high}):
            for max_items, max_bytes in ((1000, 1 << 20), (4, 1 << 20), (1000, 350), (3, 1)):
                got = disk_scan(engine, p, after, max_items, max_bytes)
                assert got == model_scan(model, p, after, lambda k: engine.partition_of(k.decode())), (p, after)
        for key, it in model.items():
            if engine.partition_of(key.decode()) == p and not it.deleted:
                assert engine.get(key.decode()).value == it.value


def test_rewrites_after_flush_are_scanned_once_and_survive_restart(make_engine) -> None:
    engine = make_engine(partitions=1, **SLOW_FLUSH)
    engine.write_batch([WriteOp(Op.MUTATION, f"k{i}", b"old") for i in range(100)])
    engine.flush_now()
    engine.write_batch([WriteOp(Op.MUTATION, f"k{i}", b"new") for i in range(0, 100, 3)])
    engine.write_batch([WriteOp(Op.DELETION, f"k{i}") for i in range(1, 100, 10)])
    engine.flush_now()
    before = disk_scan(engine, 0)
    assert len(before) == 100 and len({i.key for i in before}) == 100
    assert [i.seqno for i in before] == sorted(i.seqno for i in before)
    assert {i.value for i in before if i.key == b"k3"} == {b"new"}
    with engine._store.read_txn() as txn:
        assert txn.stat(engine._store.stale_dbs[0])["entries"] == 34 + 10 - 3  # k21, k51, k81: both
    engine.close()
    again = make_engine(partitions=1, **SLOW_FLUSH)
    assert disk_scan(again, 0) == before
    tombstones = [i.seqno for i in before if i.deleted]
    assert again.compact() == {0: max(tombstones)}  # purges every persisted tombstone
    assert disk_scan(again, 0) == [i for i in before if not i.deleted]
    with again._store.read_txn() as txn:
        assert txn.stat(again._store.stale_dbs[0])["entries"] == 0


def test_compaction_drops_stale_entries_and_merges_small_blocks(make_engine, monkeypatch) -> None:
    monkeypatch.setattr(compaction, "COMPACT_MIN_STALE", 50)
    monkeypatch.setattr(compaction, "COMPACT_MIN_BLOCKS", 1000)
    engine = make_engine(partitions=1, **SLOW_FLUSH)
    for r in range(40):  # 40 small flushes rewriting the same 10 keys
        engine.write_batch([WriteOp(Op.MUTATION, f"k{i}", b"r%d" % r) for i in range(10)])
        engine.flush_now()
    s = engine._store
    with s.read_txn() as txn:
        stale = txn.stat(s.stale_dbs[0])["entries"]
        blocks = txn.stat(s.block_dbs[0])["entries"]
    assert stale <= 50 and blocks < 40  # compacted at least once: marks cleared, blocks merged
    got = disk_scan(engine, 0)
    assert [(i.key, i.value) for i in got] == [(b"k%d" % i, b"r39") for i in range(10)]


def test_block_codec_round_trip_and_cuts(monkeypatch) -> None:
    items = [Item("ключ".encode(), 5, 7, 1, False, b"\xff\x00" * 3), Item(b"a", 6, 8, 2, True, b""),
             Item(b"k" * 250, 9, (1 << 64) - 1, 3, False, b"z" * 1000)]
    cols = tuple(zip(*items))
    dec = decode_block(encode_block(*cols))
    assert list(zip(dec[0], dec[1], dec[2], dec[3], map(bool, dec[4]), dec[5])) == items
    monkeypatch.setattr(blocks, "BLOCK_VALUE_BYTES", 6)
    cut = list(blocks.split_blocks(*cols))
    assert [k for k, _ in cut] == [records.SEQNO.pack(s) for s in (5, 6, 9)] or \
        [k for k, _ in cut] == [records.SEQNO.pack(s) for s in (5, 9)]
    back = [x for _, blob in cut for x in zip(*decode_block(blob))]
    assert [x[1] for x in back] == [5, 6, 9]
    for item in items:
        blob = next(b for _, b in cut if item.seqno in decode_block(b)[1])
        assert blocks.block_value(blob, item.seqno) == item.value
        assert blocks.block_value(blob, 4) is None


@pytest.mark.parametrize("stored_format", [b"1", b"999"], ids=["format-1", "unknown"])
def test_other_format_data_dir_is_refused_with_a_typed_error(make_engine, tmp_path, stored_format: bytes) -> None:
    """The previous format and an unknown one: refused, never converted in place (still an
    ``InvalidInput``, which is what an unknown format raised before format 2)."""
    make_engine().close()
    env = lmdb.open(str(tmp_path / "data"), max_dbs=20)
    with env.begin(write=True) as txn:
        txn.put(b"format", stored_format, db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(IncompatibleDataDir) as err:
        make_engine()
    assert isinstance(err.value, InvalidInput)
    assert err.value.code == "data_dir_format" and err.value.field == "data_dir"
    assert f"format {stored_format.decode()}" in str(err.value) and "format 2" in str(err.value)


@pytest.mark.parametrize("n", [1, 2, 7, blocks.SMALL_BLOCK_ITEMS, blocks.SMALL_BLOCK_ITEMS + 1, 100])
def test_a_small_blocks_one_struct_layout_is_the_columns_layout(n: int, monkeypatch) -> None:
    rng = random.Random(n)
    items = [Item(b"k%d" % rng.randrange(10**6), 10 + i, rng.randrange(1 << 64), rng.randrange(1, 1 << 40),
                  rng.random() < 0.3, bytes(rng.randrange(256) for _ in range(rng.randrange(40)))) for i in range(n)]
    cols = tuple(zip(*items))
    fast = encode_block(*cols)
    monkeypatch.setattr(blocks, "SMALL_BLOCK_ITEMS", -1)  # every block through the arrays
    assert fast == encode_block(*cols)
    dec = decode_block(fast)
    assert list(zip(dec[0], dec[1], dec[2], dec[3], map(bool, dec[4]), dec[5])) == items
