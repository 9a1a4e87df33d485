"""What a replica's rollback costs it, by undo against by resync, in one process.

    .venv/bin/python -m bench.replica_undo                      # 100,000 items, 10/1,000/10,000 undone
    .venv/bin/python -m bench.replica_undo --items 20000 --above 10 100

A real engine (LMDB, flusher) as the replica holds ``--items`` keys (180-byte values) applied as
its active would send them, persisted; then ``--above`` of those keys, chosen at random, are
rewritten above the rollback seqno S (the history a failover took back).  Measured on fresh
copies of that state:

* **undo**: ``Engine.undo_replica(p, S)`` (flush, the walk back for the keys' versions at S, one
  transaction);
* **resync**: ``Engine.reset_partition`` and the whole history up to S applied again and flushed,
  the replica's own share of a resync (the active's scan and the network come on top, so this
  is a lower bound of what a resync costs).

The figure is the process's CPU seconds (every thread, the flusher's included), so that other
processes on the machine change it little; the wall time is printed beside it.  Nothing here is
asserted.
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from engine.cluster.replica_rollback import Undo
from engine.config import EngineConfig
from engine.core.types import FailoverEntry, Item, PartitionState
from engine.engine import Engine
from engine.replica import ItemsStep, MarkerStep

P = 0
BATCH = 1000


def history(items: int) -> list[Item]:
    return [Item(f"key-{i:08d}".encode(), i + 1, 1_700_000_000_000_000_000 + i, 1, False, b"v" * 180)
            for i in range(items)]


def apply(engine: Engine, items: list[Item]) -> None:
    """``items`` as snapshots of ``BATCH`` items, as an active's stream carries them."""
    for i in range(0, len(items), BATCH):
        chunk = items[i:i + BATCH]
        engine.apply_replica_run([MarkerStep(P, chunk[0].seqno, chunk[-1].seqno), ItemsStep(P, chunk, True)])
    engine.flush_now()


def replica(data_dir: Path) -> Engine:
    engine = Engine.open(EngineConfig(data_dir=data_dir, partitions=1))
    engine.set_state(P, PartitionState.REPLICA)
    engine.adopt_failover_log(P, (FailoverEntry(77, 0),))
    return engine


def build(data_dir: Path, base: list[Item], above: int, seed: int) -> int:
    """The replica's state: ``base``, then ``above`` random keys rewritten; returns S."""
    engine = replica(data_dir)
    try:
        apply(engine, base)
        s = engine.high_seqno(P)
        rng = random.Random(seed)
        chosen = sorted(rng.sample(range(len(base)), above))
        apply(engine, [Item(base[k].key, s + 1 + j, base[-1].cas + 1 + j, 2, False, b"w" * 180)
                       for j, k in enumerate(chosen)])
        return s
    finally:
        engine.close()


def measure(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--above", type=int, nargs="+", default=[10, 1000, 10_000])
    args = parser.parse_args(argv)
    base = history(args.items)
    root = Path(tempfile.mkdtemp(prefix="bench-undo-"))
    try:
        print(f"replica of {args.items} items; CPU s (wall s) of each answer to a rollback")
        print(f"{'undone':>8} {'undo cpu':>9} {'(wall)':>8} {'resync cpu':>11} {'(wall)':>8} {'undo/resync':>12}")
        for above in args.above:
            state = root / f"state-{above}"
            s = build(state, base, above, seed=above)
            undo_dir, resync_dir = root / f"undo-{above}", root / f"resync-{above}"
            shutil.copytree(state, undo_dir)
            shutil.copytree(state, resync_dir)
            with replica(undo_dir) as engine:
                result = []
                undo = measure(lambda: result.append(engine.undo_replica(P, s)))
                assert isinstance(result[0].plan, Undo), result[0].plan
            with replica(resync_dir) as engine:
                def resync() -> None:
                    engine.reset_partition(P)
                    apply(engine, base)
                redo = measure(resync)
            print(f"{above:>8} {undo[0]:>9.3f} {undo[1]:>8.3f} {redo[0]:>11.3f} {redo[1]:>8.3f} "
                  f"{undo[0] / redo[0]:>12.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
