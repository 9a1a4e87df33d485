"""Engine benchmark: the storage engine against the raw libraries it is built on, in one run.

    .venv/bin/python -m bench.bench_engine            # default: 200k items, ~1 minute
    .venv/bin/python -m bench.bench_engine --full     # 1M items everywhere

Figures printed (compare the ratios; absolute numbers move on shared machines):

1. ingest: raw py-lmdb ``putmulti(append=True)`` in sync'ed transactions of 1000 items (the
   limit), engine ``write_batch`` of 1000 x 200-byte mutations into memory, and the flusher
   persisting those same items (``flush_now``), plus ingest with the flusher running.
2. scan: a raw LMDB cursor walk over the raw database vs the engine's snapshot reader over
   the engine's by-seqno trees (same items), as ``Item`` lists (``batches()``) and as
   ``frames.Columns`` (``columns()``), each also with the binary frame encoding on top.
3. rewrites (the HTTP bulk benchmark's pattern): 40k keys of 75 bytes, then rounds of 1000
   rewrites in random key order, each round persisted by its own flush (``flush_now``): the
   flusher's thread CPU per rewrite (``engine_stats()["flush_cpu_seconds_total"]``), and a
   ``columns()`` scan of the resulting disk data (small blocks, stale entries, compactions).
4. memory: a queue of N items (default 1e6), then 100 live snapshots of it with 10 new
   writes and 10 rewrites between consecutive snapshots.
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import struct
import tempfile
import time
import tracemalloc
from pathlib import Path

import lmdb

from engine.batch_writer import BatchWriter
from engine.config import EngineConfig
from engine.core.types import Op, PartitionState, WriteOp
from engine.engine import Engine
from engine.flusher import lmdb_turn
from engine.partition import Partition
from engine.protocol.frames import encode_binary, encode_binary_columns
from engine.storage.store import Store
from engine.writequeue import WriteQueue

BATCH = 1000
VALUE_BYTES = 200


class Timer:
    """Wall and process-CPU time of a block: on a shared machine the CPU figure is steadier
    (it includes the flusher thread's CPU, but not fsync waits)."""

    def __enter__(self) -> "Timer":
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def rate(count: int, t: Timer) -> str:
    return f"{count / t.wall / 1e6:6.3f} M/s wall {count / t.cpu / 1e6:6.3f} M/s cpu"


def make_ops(count: int, value: bytes) -> list[list[WriteOp]]:
    return [[WriteOp(Op.MUTATION, f"key-{b + i:010d}", value) for i in range(BATCH)]
            for b in range(0, count, BATCH)]


def raw_lmdb(path: Path, count: int, value: bytes) -> dict[str, Timer]:
    """The limits: seqno-keyed records appended with ``putmulti`` (sync'ed txns of 1000, and
    one txn for everything), then a full cursor scan copying keys and values."""
    pack = struct.Struct(">Q").pack
    env = lmdb.open(str(path), map_size=1 << 36, sync=True, max_dbs=2)
    small, big = env.open_db(b"txn1000"), env.open_db(b"txn1")
    out = {}
    with Timer() as out["put_txn1000"]:
        for b in range(0, count, BATCH):
            records = [(pack(s), value) for s in range(b + 1, b + BATCH + 1)]
            with env.begin(write=True, db=small) as txn:
                txn.cursor().putmulti(records, append=True)
    with Timer() as out["put_txn1"]:
        with env.begin(write=True, db=big) as txn:
            txn.cursor().putmulti([(pack(s), value) for s in range(1, count + 1)], append=True)
    seen = 0
    with Timer() as out["scan"]:
        with env.begin(db=big) as txn:
            for _k, _v in txn.cursor():
                seen += 1
    assert seen == count
    env.close()
    return out


def engine_figures(path: Path, count: int, value: bytes, partitions: int) -> dict[str, Timer]:
    out: dict[str, Timer] = {}
    batches = make_ops(count, value)
    # into memory with the flusher idle (interval far away, nobody waiting), then flush it all
    engine = Engine.open(EngineConfig(data_dir=path / "a", partitions=partitions, flush_interval_ms=3.6e6))
    with Timer() as out["memory"]:
        for ops in batches:
            engine.write_batch(ops)
    with Timer() as out["flush"]:
        engine.flush_now()
    out["flush"].commits = engine.engine_stats()["flush_count"]  # type: ignore[attr-defined]
    # scan every partition through the snapshot reader (all on disk now): Items, columns, and
    # each with the binary frame encoding the stream does on top
    for name, columnar, encode in (("scan", False, False), ("scan_columns", True, False),
                                   ("scan_encode", False, True), ("scan_columns_encode", True, True)):
        seen = 0
        with Timer() as out[name]:
            for p in range(partitions):
                with engine.snapshot(p, 0) as snap:
                    for part in snap.parts:
                        if columnar:
                            for cols in part.columns():
                                seen += len(cols)
                                if encode:
                                    encode_binary_columns(p, cols, False)
                        else:
                            for batch in part.batches():
                                seen += len(batch)
                                if encode:
                                    encode_binary(p, batch, False)
        assert seen == count, (name, seen, count)
    engine.close()
    # ingest with the flusher running at its default interval, until everything is persisted
    engine = Engine.open(EngineConfig(data_dir=path / "b", partitions=partitions))
    with Timer() as out["ingest_persisted"]:
        for ops in batches:
            engine.write_batch(ops)
        engine.flush_now()
    out["ingest_persisted"].commits = engine.engine_stats()["flush_count"]  # type: ignore[attr-defined]
    engine.close()
    return out


def rewrite_figures(path: Path, keys: int, rounds: int, partitions: int, per_flush: int = 1) -> dict[str, float]:
    """Flusher CPU per rewrite in rounds of 1000 random-order rewrites of ``keys`` keys, every
    ``per_flush`` rounds flushed together (as concurrent ``durability=persist`` bulk requests
    share a flush), then a scan."""
    rnd = random.Random(7)
    bodies = [[WriteOp(Op.MUTATION, f"bulk-{b}-{i}", rnd.randbytes(75)) for i in range(BATCH)]
              for b in range(keys // BATCH)]
    engine = Engine.open(EngineConfig(data_dir=path / "r", partitions=partitions, flush_interval_ms=3.6e6))
    for ops in bodies:
        engine.write_batch(ops)
        engine.flush_now()
    stats = engine.engine_stats()
    cpu0, n0, commits0 = stats["flush_cpu_seconds_total"], stats["flush_items_total"], stats["flush_count"]
    order = list(range(len(bodies)))
    for r in range(rounds):
        if r % len(order) == 0:
            rnd.shuffle(order)
        engine.write_batch(bodies[order[r % len(order)]])
        if (r + 1) % per_flush == 0:
            engine.flush_now()
    engine.flush_now()
    stats = engine.engine_stats()
    out = {"flush_cpu_us": (stats["flush_cpu_seconds_total"] - cpu0) / (stats["flush_items_total"] - n0) * 1e6,
           "rounds": stats["flush_count"] - commits0}
    seen = 0
    with Timer() as t:
        for p in range(partitions):
            with engine.snapshot(p, 0) as snap:
                for part in snap.parts:
                    for cols in part.columns():
                        seen += len(cols)
    assert seen == keys, (seen, keys)
    out["scan_cpu_mps"] = seen / t.cpu / 1e6
    engine.close()
    return out


def snapshot_memory(count: int, tmp: Path) -> tuple[int, int]:
    """Bytes of one queue of ``count`` items vs 100 more live snapshots of it, the items queued
    by the production write path (``BatchWriter`` over an empty store)."""
    store = Store.open(tmp / "memory", 1, 1 << 30, 25).store
    queue = WriteQueue(0)
    part = Partition(id=0, state=PartitionState.ACTIVE, failover_log=(), purge_seqno=0, live_items=0,
                     persisted_live=0, queue=queue)
    writer = BatchWriter([part], store, lmdb_turn(), max_key_bytes=250, max_value_bytes=1 << 20)
    value = b"v" * 16
    try:
        gc.collect()
        tracemalloc.start()
        for b in range(0, count, 10_000):
            writer.write([(Op.MUTATION, f"k{i}", value, None) for i in range(b, b + 10_000)])
        one = tracemalloc.get_traced_memory()[0]
        snaps = [queue.root]
        for s in range(100):
            # 10 rewrites spread over the queue, 10 new keys
            ops = [(Op.MUTATION, f"k{(s * 7919 + i * 104729) % count}", value, None) for i in range(10)]
            ops += [(Op.MUTATION, f"n{s}-{i}", value, None) for i in range(10)]
            writer.write(ops)
            snaps.append(queue.root)
        hundred = tracemalloc.get_traced_memory()[0] - one
        tracemalloc.stop()
    finally:
        store.close()
    assert len(snaps) == 101 and snaps[0].high == count
    return one, hundred


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--queue-items", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--full", action="store_true", help="1M items for every figure")
    parser.add_argument("--rewrite-keys", type=int, default=40_000)
    parser.add_argument("--rewrite-rounds", type=int, default=600)
    parser.add_argument("--rewrite-per-flush", type=int, default=1, help="rewrite rounds persisted by one flush")
    args = parser.parse_args()
    count = 1_000_000 if args.full else args.items
    count -= count % BATCH
    value = os.urandom(VALUE_BYTES)
    tmp = Path(tempfile.mkdtemp(prefix="upr-bench-engine-"))
    try:
        # Engine.open raises the GC threshold; do it first so the raw figures run under the same GC
        Engine.open(EngineConfig(data_dir=tmp / "warm", partitions=1)).close()
        print(f"engine bench: {count} items x {VALUE_BYTES} B, batches of {BATCH}, {args.partitions} partitions,"
              f" gc threshold {gc.get_threshold()}")
        raw = raw_lmdb(tmp / "raw", count, value)
        e = engine_figures(tmp, count, value, args.partitions)
        print("ingest")
        print(f"  raw lmdb putmulti, txns of 1000      {rate(count, raw['put_txn1000'])}")
        print(f"  raw lmdb putmulti, one txn           {rate(count, raw['put_txn1'])}")
        print(f"  engine write_batch into memory       {rate(count, e['memory'])}")
        flush = e["flush"]
        print(f"  engine flusher persist               {rate(count, flush)}"
              f"  ({flush.commits:.0f} commits)")  # type: ignore[attr-defined]
        print(f"    = {raw['put_txn1'].wall / flush.wall:.0%} of raw one-txn,"
              f" {raw['put_txn1000'].wall / flush.wall:.0%} of raw txns-of-1000 (wall)")
        both = e["ingest_persisted"]
        print(f"  engine ingest + persist, flusher on  {rate(count, both)}"
              f"  ({both.commits:.0f} commits)")  # type: ignore[attr-defined]
        print("scan by seqno")
        print(f"  raw lmdb cursor scan                 {rate(count, raw['scan'])}")
        scan = raw["scan"]
        for name, label in (("scan", "snapshot reader, batches() -> Items"),
                            ("scan_columns", "snapshot reader, columns()"),
                            ("scan_encode", "batches() + encode_binary"),
                            ("scan_columns_encode", "columns() + encode_binary_columns")):
            t = e[name]
            print(f"  {label:37}{rate(count, t)}  = {scan.wall / t.wall:.0%} of raw wall, {scan.cpu / t.cpu:.0%} cpu")
        rw = rewrite_figures(tmp, args.rewrite_keys, args.rewrite_rounds, args.partitions, args.rewrite_per_flush)
        print(f"rewrites ({args.rewrite_keys} keys x 75 B, {args.rewrite_rounds} rounds of {BATCH} random-order"
              f" rewrites, a flush every {args.rewrite_per_flush})")
        print(f"  flusher thread cpu per rewrite        {rw['flush_cpu_us']:6.2f} us  ({rw['rounds']:.0f} flushes)")
        print(f"  columns() scan of the result          {rw['scan_cpu_mps']:6.3f} M/s cpu")
        one, hundred = snapshot_memory(args.queue_items if not args.full else 1_000_000, tmp)
        print(f"memory of write-queue snapshots ({args.queue_items if not args.full else 1_000_000} items)")
        print(f"  one queue (items + vector)          {one / 1e6:8.1f} MB")
        print(f"  100 more live snapshots             {hundred / 1e6:8.2f} MB  (+{hundred / one:.2%})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
