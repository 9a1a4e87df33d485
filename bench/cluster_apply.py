"""The replica's apply path alone, in one process: CPU per replicated item when a replica applies
what a busy active sends (a marker and a batch of one or two items per partition per pass).

    .venv/bin/python -m bench.cluster_apply                 # 64 partitions, 100,000 items
    .venv/bin/python -m bench.cluster_apply --items 20000 --partitions 16

A real engine (LMDB, flusher) as the replica is fed the same steps three ways, each on a fresh
data dir: one engine call per message (``replica_marker`` / ``apply_replicated``), one engine
call per received run of ``--run`` messages (``Engine.apply_replica_run``), and the same with
keys already on disk (rev > 1: the by-key lookup the live count needs).  The figure is the
process's CPU time (every thread: the flusher's persistence included) per item, so that other
processes on the machine change it little; the wall time is printed beside it.  Nothing here
is asserted; ``tests/bench/test_bench_cluster.py`` runs it once at a tiny size.
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from engine.config import EngineConfig
from engine.core.types import FailoverEntry, Item, PartitionState
from engine.engine import Engine
from engine.replica import ItemsStep, MarkerStep, ReplicaStep


def passes(partitions: int, items: int, rev: int, seed: int = 14) -> list[ReplicaStep]:
    """What a replication stream of a busy active carries: pass after pass, each partition that
    got writes since the last pass gets a marker and one batch of its one or two new items."""
    rng = random.Random(seed)
    high = [0] * partitions
    steps: list[ReplicaStep] = []
    made = 0
    while made < items:
        for p in range(partitions):
            n = min(rng.choice((1, 1, 1, 2)), items - made)
            if n <= 0:
                break
            start = high[p] + 1
            batch = [Item(f"k{p}-{high[p] + i}".encode(), high[p] + 1 + i, 1_700_000_000_000_000_000 + made + i, rev,
                          False, b"v" * 180) for i in range(n)]
            high[p] += n
            made += n
            steps += [MarkerStep(p, start, high[p]), ItemsStep(p, batch, True)]
    return steps


def replica(data_dir: Path, partitions: int) -> Engine:
    engine = Engine.open(EngineConfig(data_dir=data_dir, partitions=partitions))
    for p in range(partitions):
        engine.set_state(p, PartitionState.REPLICA)
        engine.adopt_failover_log(p, (FailoverEntry(77, 0),))
    return engine


def per_message(engine: Engine, steps: list[ReplicaStep], _run: int) -> None:
    for step in steps:
        if type(step) is MarkerStep:
            engine.replica_marker(step.partition, step.start, step.end)
        else:
            engine.apply_replicated(step.partition, step.items, last=step.last)  # type: ignore[union-attr]


def per_run(engine: Engine, steps: list[ReplicaStep], run: int) -> None:
    for i in range(0, len(steps), run):
        engine.apply_replica_run(steps[i:i + run])


def measure(name: str, apply, partitions: int, items: int, run: int, on_disk: bool) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="upr-apply-"))
    try:
        engine = replica(work, partitions)
        try:
            if on_disk:  # every key already persisted once, so the next versions (rev 2) look it up
                per_run(engine, passes(partitions, items, 1), run)
                engine.flush_now()
                base = {p: engine.high_seqno(p) for p in range(partitions)}
                steps = _shifted(passes(partitions, items, 2), base)
            else:
                steps = passes(partitions, items, 1)
            cpu, wall = time.process_time(), time.perf_counter()
            apply(engine, steps, run)
            engine.flush_now()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        finally:
            engine.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"name": name, "cpu_us": cpu / items * 1e6, "wall_us": wall / items * 1e6, "messages": len(steps)}


def _shifted(steps: list[ReplicaStep], base: dict[int, int]) -> list[ReplicaStep]:
    """The same steps after what ``base`` holds (seqnos moved up, keys the same)."""
    out: list[ReplicaStep] = []
    for s in steps:
        b = base[s.partition]
        if type(s) is MarkerStep:
            out.append(MarkerStep(s.partition, s.start + b, s.end + b))
        else:
            out.append(ItemsStep(s.partition, [i._replace(seqno=i.seqno + b) for i in s.items], s.last))  # type: ignore[union-attr]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--run", type=int, default=128, help="messages per received run (one engine call each)")
    args = p.parse_args(argv)
    rows = [
        measure("one engine call per message, new keys", per_message, args.partitions, args.items, args.run, False),
        measure(f"one engine call per run of {args.run}, new keys (rev 1: no lookup)", per_run, args.partitions,
                args.items, args.run, False),
        measure(f"one engine call per run of {args.run}, keys on disk (rev 2: looked up)", per_run,
                args.partitions, args.items, args.run, True),
    ]
    print(f"replica apply path: {args.items:,} items over {args.partitions} partitions, a marker and a batch of "
          f"1-2 items per partition per pass ({rows[0]['messages']:,} messages)\n")
    print("| how | CPU per item (all threads) | wall per item |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['cpu_us']:.1f} µs | {r['wall_us']:.1f} µs |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
