"""The flusher's CPU per round for the tail's small writes, in process, load-independent.

    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_flush_round [--rounds 300] [--docs 50] [--profile]

Each round: one ``write_batch`` of ``--docs`` new keys (200-byte values; spread over the 64
partitions as the suite's tail writer's are), then one ``Flusher.flush_round`` on this thread (the
flusher's own thread is idle: the interval is an hour and nobody waits).  Printed: the round's
thread CPU per round, per partition written and per document, split into the build (the
transaction's puts: the GIL-holding part, but for the LMDB calls themselves), the commit (page
writes and fsync, the GIL released) and the rest (the queues' bookkeeping under the writer lock,
the waiters), the round's wall time, and with ``--profile`` the top functions.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from engine.config import EngineConfig
from engine.core.types import Op
from engine.engine import Engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--docs", type=int, default=50)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    value = b'{"n":1,"pad":"' + b"x" * 180 + b'"}'
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        engine = Engine.open(EngineConfig(data_dir=Path(tmp) / "e", partitions=args.partitions,
                                          flush_interval_ms=3.6e6))
        flusher = engine._flusher  # noqa: SLF001 - a benchmark drives the round itself
        store = flusher._store  # noqa: SLF001
        store_write = store.write
        spans: list[tuple[float, float]] = []  # (build CPU, whole store.write CPU) per round

        def timed_write(fn):  # type: ignore[no-untyped-def]
            def build(txn):  # type: ignore[no-untyped-def]
                b0 = time.thread_time()
                out = fn(txn)
                spans.append((time.thread_time() - b0, 0.0))
                return out

            w0 = time.thread_time()
            out = store_write(build)
            spans[-1] = (spans[-1][0], time.thread_time() - w0)
            return out

        store.write = timed_write  # type: ignore[method-assign]
        builds: list[float] = []
        commits: list[float] = []
        cpu: list[float] = []
        wall: list[float] = []
        parts: list[int] = []
        prof = cProfile.Profile() if args.profile else None
        n = 0
        for r in range(args.rounds + 20):
            ops = [(Op.MUTATION, f"k{n + i:09d}", value, None) for i in range(args.docs)]
            n += args.docs
            results = engine.write_batch(ops)
            touched = len({res.partition for res in results})
            c0, w0 = time.thread_time(), time.perf_counter()
            if prof is not None and r >= 20:
                prof.enable()
            flusher.flush_round()
            if prof is not None:
                prof.disable()
            c1, w1 = time.thread_time(), time.perf_counter()
            if r >= 20:  # warm-up rounds left out
                build_s, write_s = spans[-1]
                builds.append(build_s * 1e6)
                commits.append((write_s - build_s) * 1e6)
                cpu.append((c1 - c0) * 1e6)
                wall.append((w1 - w0) * 1e3)
                parts.append(touched)
        engine.close()
    mean_cpu = statistics.fmean(cpu)
    mean_parts = statistics.fmean(parts)
    print(f"{args.rounds} rounds of {args.docs} documents over {mean_parts:.1f} partitions: "
          f"round CPU p50 {statistics.median(cpu):.0f} µs, mean {mean_cpu:.0f} µs "
          f"({mean_cpu / mean_parts:.1f} µs per partition, {mean_cpu / args.docs:.1f} µs per document); "
          f"round wall p50 {statistics.median(wall):.2f} ms")
    build, commit = statistics.fmean(builds), statistics.fmean(commits)
    print(f"  build {build:.0f} µs ({build / mean_parts:.1f} µs per partition), commit {commit:.0f} µs, "
          f"the rest {mean_cpu - build - commit:.0f} µs ({(mean_cpu - build - commit) / mean_parts:.1f} µs per partition)")
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
