"""Point-lookup latency of ``upr index query`` (pyarrow over the Parquet runs, no JVM).

    .venv/bin/python -m bench.bench_index                 # 1e6 documents, 200 cities
    .venv/bin/python -m bench.bench_index --docs 100000

Writes a synthetic index generation shaped like one ``IndexJob`` leaves after a full build and
incremental runs (one base run of ``--docs`` entries, then ``--deltas`` runs of 1% changes each,
some deletions as markers, one run resetting a partition) with pyarrow, commits its manifest, and
prints, for ``--queries`` lookups of random cities:
* in-process ``lookup()`` latency p50/p95 and CPU p50 (what a service holding the module pays);
* ``upr index query`` as a new process (``python -m app.cli index query``, what the ``upr``
  script runs) ``--procs`` times: p50/p95/p99 wall and p50/p99 CPU: interpreter start, imports
  and the lookup, as a shell user sees it (CPU is the figure that survives a loaded machine);
* the load average at the start and the end (the machine is shared).

The new processes run after one unmeasured run allowed to write the bytecode caches (an installed
wheel has them; a checkout with ``PYTHONDONTWRITEBYTECODE`` set would otherwise measure the
compilation of every changed module).

Each run gets its lookup sidecar as ``IndexJob`` writes it (time and size printed);
``--no-sidecars`` leaves them out, so lookups read the Parquet runs with pyarrow (the path of a
remote index), for a side-by-side figure with the same command otherwise.
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(root: Path, docs: int, deltas: int, cities: int, seed: int = 1, sidecars: bool = True) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_connector.index.manifest import Manifest, Run, commit
    from spark_connector.index.sidecar import SIDECAR, seal_run
    from spark_connector.index.storage import open_location

    rng = random.Random(seed)
    names = [f"city-{i:03d}" for i in range(cities)]
    schema = pa.schema([("value", pa.string()), ("key", pa.string()), ("partition", pa.int32()),
                        ("seqno", pa.int64())])
    runs = []

    where = open_location(root)
    sealing = []

    def write(path: str, values: list, keys: list, parts: list, seqnos: list, resets: tuple = ()) -> None:
        (root / path).mkdir(parents=True)
        pq.write_table(pa.table([values, keys, parts, seqnos], schema=schema), root / path / "part-00000.parquet")
        if not sidecars:
            runs.append(Run(path, resets, len(keys)))
            return
        t, c = time.monotonic(), time.process_time()
        runs.append(seal_run(where, path, resets, first=not runs))     # as IndexJob does before a commit
        sealing.append((len(keys), time.monotonic() - t, time.process_time() - c,
                        os.path.getsize(root / path / SIDECAR), os.path.getsize(root / path / "part-00000.parquet")))

    keys = [f"doc-{i:07d}" for i in range(docs)]
    write("runs/c-000001-base", [rng.choice(names) for _ in keys], keys, [i % 64 for i in range(docs)],
          list(range(1, docs + 1)))
    seqno = docs
    for d in range(deltas):
        changed = rng.sample(range(docs), max(1, docs // 100))
        values = [None if rng.random() < 0.1 else rng.choice(names) for _ in changed]
        seqno += len(changed)
        write(f"runs/r-{d + 2:06d}-delta", values, [keys[i] for i in changed], [i % 64 for i in changed],
              list(range(seqno - len(changed) + 1, seqno + 1)), resets=(7,) if d == deltas - 1 else ())
    commit(root, Manifest(len(runs), len(runs), {"kind": "field", "path": "city"}, "http://127.0.0.1:1",
                          tuple(runs), rows=docs))
    for rows, seconds, cpu, size, parquet in sealing:
        print(f"lookup sidecar of a run of {rows} rows: {seconds:.2f}s wall, {cpu:.2f}s CPU, {size / 1e6:.1f} MB "
              f"(its Parquet file: {parquet / 1e6:.1f} MB)")
    return len(names)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--deltas", type=int, default=3)
    ap.add_argument("--cities", type=int, default=200)
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--procs", type=int, default=30, help="new-process runs of `upr index query`")
    ap.add_argument("--no-sidecars", action="store_true",
                    help="runs without lookup sidecars (the Parquet path, as for a remote index)")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="bench-index-") as tmp:
        root = Path(tmp) / "idx"
        t = time.monotonic()
        build(root, args.docs, args.deltas, args.cities, sidecars=not args.no_sidecars)
        print(f"index: {args.docs} documents, 1 base + {args.deltas} delta runs, written in "
              f"{time.monotonic() - t:.1f}s")
        from spark_connector.index.lookup import lookup
        rng = random.Random(2)
        inproc, cpu, hits = [], [], []
        lookup(root, "city-000")                 # imports and the first file opens
        for _ in range(args.queries):
            city = f"city-{rng.randrange(args.cities):03d}"
            t, c = time.perf_counter(), time.process_time()
            hits.append(len(lookup(root, city)))
            inproc.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        print(f"lookup() in process: p50 {pct(inproc, 0.5) * 1e3:.0f} ms, p95 {pct(inproc, 0.95) * 1e3:.0f} ms "
              f"wall; CPU p50 {pct(cpu, 0.5) * 1e3:.0f} ms ({statistics.mean(hits):.0f} keys per answer, "
              f"{args.queries} queries)")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # one unmeasured run that may write the bytecode caches, as an installed package has them:
        # under PYTHONDONTWRITEBYTECODE a checkout's changed modules are compiled in every process
        query = [sys.executable, "-m", "app.cli", "index", "query", "--index", str(root), "--value"]
        subprocess.run([*query, "city-000"], env={k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"},
                       check=True, stdout=subprocess.DEVNULL)
        procs, proc_cpu = [], []
        for _ in range(args.procs):
            city = f"city-{rng.randrange(args.cities):03d}"
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run([*query, city], env=env, check=True, stdout=subprocess.DEVNULL)
            procs.append(time.perf_counter() - t)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc_cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        print(f"upr index query (new process): p50 {pct(procs, 0.5) * 1e3:.0f} ms, "
              f"p95 {pct(procs, 0.95) * 1e3:.0f} ms, p99 {pct(procs, 0.99) * 1e3:.0f} ms wall; "
              f"CPU p50 {pct(proc_cpu, 0.5) * 1e3:.0f} ms, p99 {pct(proc_cpu, 0.99) * 1e3:.0f} ms "
              f"({len(procs)} runs)")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        bare = []
        for _ in range(max(5, args.procs // 3)):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
            bare.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_bare = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / len(bare)
        print(f"reference, an empty interpreter (python -c pass): p50 {pct(bare, 0.5) * 1e3:.0f} ms wall, "
              f"CPU mean {cpu_bare * 1e3:.0f} ms")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
