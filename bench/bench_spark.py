"""Spark connector figures: source throughput beside the raw client stream, full vs incremental index.

    .venv/bin/python -m bench.bench_spark            # 50k documents (under two minutes)
    .venv/bin/python -m bench.bench_spark --full     # 1e6 documents (the issue's size)

Prints, from one run against one server process (127.0.0.1, ephemeral port):
* SparkSession start (reported apart: a service keeps one session alive);
* rows/s of the raw client stream (``clients.SyncConsumer.batches()``, until now, no ring) and of the
  connector's task reader alone (no Spark), beside rows/s through ``spark.read.format("upr")``
  into the ``noop`` sink (cold = first query in the JVM; then three rounds of raw client, task
  reader and a warm read, each ratio taken inside its round) -- same data, same run, with the
  CPU each read cost by process (driver, executor JVM, Python workers, server: ``proc_cpu``);
* the full index build (``IndexJob``, field ``city``; at the default size after a warm-up build
  into a scratch directory, so one-time JVM costs are not counted) and four incremental runs,
  each after its own 1% of the documents changed, with their ratios to the full build and the
  median (the fourth run includes a compaction); then the same size of change picked up by a
  running ``--follow`` query (time from the writes' return to the manifest commit);
* the load average at the start and the end (the machine is shared: figures move with it).

    .venv/bin/python -m bench.bench_spark --standalone --docs 200000

runs the source part only (raw client, task reader, ``format("upr")`` reads) on a standalone
master and one worker started on 127.0.0.1 (``--worker-cores``), the executors running this
interpreter with this checkout on their ``PYTHONPATH``, beside the raw client in the same run.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.proc_cpu import describe, snapshot, spent
from bench.server import start_upr_server

import httpx

ROOT = Path(__file__).resolve().parents[1]
CITIES = [f"city-{i:03d}" for i in range(200)]
INCREMENTAL_RUNS = 4   # the 4th adds a 5th run to the index: it pays a compaction (max_runs=4)


def start_server(work: Path, partitions: int) -> tuple[subprocess.Popen[bytes], str]:
    return start_upr_server(work, data_dir=work / "data", partitions=partitions)


def load(url: str, keys: range, rng: random.Random, pad: str) -> None:
    with httpx.Client(timeout=120) as http:
        batch = []
        for i in keys:
            batch.append({"op": "set", "key": f"doc-{i:08d}",
                          "value": {"city": rng.choice(CITIES), "n": i, "pad": pad}})
            if len(batch) == 5000:
                http.post(url + "/docs/_bulk", params={"durability": "persist"}, json=batch).raise_for_status()
                batch = []
        if batch:
            http.post(url + "/docs/_bulk", params={"durability": "persist"}, json=batch).raise_for_status()


def raw_client_rate(url: str) -> tuple[int, float]:
    from clients.sync import SyncConsumer
    from engine.protocol.frames import ItemBatch
    n = 0
    t = time.perf_counter()
    with SyncConsumer(url, name="bench-raw", start="beginning", until_now=True, ring_size=0) as c:
        for x in c.batches():
            if isinstance(x, ItemBatch):
                n += len(x)
    return n, time.perf_counter() - t


def task_reader_rate(url: str) -> tuple[int, float]:
    """The connector's ``read()`` for one task holding every partition, without Spark."""
    from spark_connector.meta import fetch_meta
    from spark_connector.offsets import PartitionOffset, SourceOffset
    from spark_connector.options import parse_options
    from spark_connector.source import _input_partitions
    from spark_connector.task import read_task
    opts = parse_options({"server": url, "minPartitions": "1"})
    meta = fetch_meta(opts)
    start = SourceOffset({p: PartitionOffset() for p in meta.partitions}, meta.num_partitions)
    end = SourceOffset({p: PartitionOffset(s.uuid, s.high_seqno, s.high_seqno, s.high_seqno)
                        for p, s in meta.partitions.items()}, meta.num_partitions)
    parts = _input_partitions(opts, start, end)
    n = 0
    t = time.perf_counter()
    for part in parts:
        for rb in read_task(part):
            n += rb.num_rows
    return n, time.perf_counter() - t


#: extra options of every ``format("upr")`` read (``--source-option``)
SOURCE_OPTIONS: dict[str, str] = {}


def source_rate(spark, url: str, options: dict[str, str] | None = None) -> tuple[int, float, dict[str, float]]:  # type: ignore[no-untyped-def]
    """Rows, seconds and CPU by process of one ``format("upr")`` read into ``noop`` (the row count
    comes from a second read, outside the figures)."""
    before = snapshot()
    t = time.perf_counter()
    df = spark.read.format("upr").option("server", url).options(**(SOURCE_OPTIONS if options is None else options)).load()
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - t
    cpu = spent(before, snapshot())
    return spark.read.format("upr").option("server", url).load().count(), elapsed, cpu


def measured(read):  # type: ignore[no-untyped-def]
    """``read()``'s (rows, seconds) and the CPU seconds by process it cost (``bench.proc_cpu``)."""
    before = snapshot()
    n, s = read()
    return n, s, spent(before, snapshot())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="1e6 documents instead of 5e4")
    ap.add_argument("--docs", type=int, default=None)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--master", default="local[*,4]")
    ap.add_argument("--standalone", action="store_true",
                    help="source figures only, on a standalone master + worker on 127.0.0.1")
    ap.add_argument("--worker-cores", type=int, default=2)
    ap.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of the format('upr') reads, e.g. batchRows=65536 (repeatable)")
    ap.add_argument("--also-option", action="append", default=[], metavar="KEY=VALUE",
                    help="each round also reads with these options instead (a same-round comparison)")
    args = ap.parse_args()
    SOURCE_OPTIONS.update(kv.split("=", 1) for kv in args.source_option)
    also = dict(kv.split("=", 1) for kv in args.also_option)
    docs = args.docs or (1_000_000 if args.full else 50_000)
    rng = random.Random(1)
    pad = "x" * 120          # ~200-byte documents
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    proc, url = start_server(work, args.partitions)
    try:
        print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        t = time.perf_counter()
        load(url, range(docs), rng, pad)
        print(f"loaded {docs} documents ({args.partitions} partitions) in {time.perf_counter() - t:.1f}s")

        n, s = raw_client_rate(url)
        print(f"raw client stream (SyncConsumer.batches, until now): {n} rows in {s:.2f}s = {n / s:,.0f} rows/s")
        raw = n / s
        n, s = task_reader_rate(url)
        print(f"connector task reader, no Spark (Arrow batches):   {n} rows in {s:.2f}s = {n / s:,.0f} rows/s")

        from contextlib import ExitStack

        from spark_connector.session import local_session
        stack = ExitStack()
        extra: dict[str, str] = {}
        if args.standalone:
            from bench.spark_standalone import standalone_cluster
            t = time.perf_counter()
            args.master = stack.enter_context(standalone_cluster(work / "spark", cores=args.worker_cores))
            print(f"standalone master + worker ({args.worker_cores} cores) at {args.master} "
                  f"up in {time.perf_counter() - t:.1f}s")
            # the executors import the connector from this checkout, as the driver does
            extra = {"spark.executorEnv.PYTHONPATH": str(ROOT), "spark.executor.cores": str(args.worker_cores)}
        t = time.perf_counter()
        spark = local_session(args.master, app_name="bench-spark", extra=extra)
        print(f"SparkSession start ({args.master}): {time.perf_counter() - t:.1f}s")
        n, s, _ = source_rate(spark, url)       # the JVM's and the Python workers' first tasks
        print(f"spark.read.format('upr') -> noop (cold): {n} rows in {s:.2f}s = {n / s:,.0f} rows/s "
              f"({n / s / raw:.0%} of the raw client rate)")
        # Warm reads, each beside a raw client read and a task-reader read taken just before it:
        # the machine's load drifts over minutes, so a ratio means something only inside a round.
        # CPU by process (bench/proc_cpu.py) says where each read's work went, whatever the load.
        warm, shares, reader_shares = [], [], []
        for r in range(3):
            raw_n, raw_s, raw_cpu = measured(lambda: raw_client_rate(url))
            rd_n, rd_s, rd_cpu = measured(lambda: task_reader_rate(url))
            n, s, cpu = source_rate(spark, url)
            raw_r, rd_r, src_r = raw_n / raw_s, rd_n / rd_s, n / s
            warm.append(src_r)
            shares.append(src_r / raw_r)
            reader_shares.append(rd_r / raw_r)
            print(f"round {r + 1}: raw client {raw_r:,.0f} rows/s, task reader {rd_r:,.0f} rows/s "
                  f"({rd_r / raw_r:.0%}), format('upr') -> noop warm {src_r:,.0f} rows/s ({src_r / raw_r:.0%} "
                  f"of the raw client rate, {src_r / rd_r:.0%} of the task reader's)")
            print(f"  raw client:  {describe(raw_cpu, raw_n)}")
            print(f"  task reader: {describe(rd_cpu, rd_n)}")
            print(f"  spark read:  {describe(cpu, n)}")
            if also:
                n2, s2, cpu2 = source_rate(spark, url, {**SOURCE_OPTIONS, **also})
                print(f"  with {also}: {n2 / s2:,.0f} rows/s ({n2 / s2 / raw_r:.0%} of the raw client rate), "
                      f"{describe(cpu2, n2)}")
        print(f"source warm, median of {len(warm)}: {statistics.median(warm):,.0f} rows/s = "
              f"{statistics.median(shares):.0%} of the raw client rate in the same round (goal >= 55%); "
              f"task reader alone {statistics.median(reader_shares):.0%}")
        if args.standalone:
            print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
            spark.stop()
            stack.close()
            return

        from spark_connector.index.functions import FieldIndex
        from spark_connector.index.job import IndexJob
        if not args.full:   # at 1e6 documents the one-time costs are amortised; skip the extra build
            first = IndexJob(spark, work / "warmup-index", url, FieldIndex("city")).run()
            print(f"first index build in this JVM (warm-up, not compared): {first.seconds:.1f}s {first.phases}")
        idx = work / "index"
        full = IndexJob(spark, idx, url, FieldIndex("city")).run()
        print(f"full index build: {full.rows_read} changes in {full.seconds:.1f}s {full.phases} "
              f"({full.rows_read / full.seconds:,.0f} rows/s)")
        label_of: dict[int, str] = {}     # document -> the city its last rewrite set

        def rewrite(label: str) -> None:
            keys = rng.sample(range(docs), docs // 100)
            with httpx.Client(timeout=120) as http:
                for i in range(0, len(keys), 5000):
                    ops = [{"op": "set", "key": f"doc-{k:08d}", "value": {"city": label, "n": k, "pad": pad}}
                           for k in keys[i:i + 5000]]
                    http.post(url + "/docs/_bulk", params={"durability": "persist"}, json=ops).raise_for_status()
            label_of.update((k, label) for k in keys)

        # Four incremental runs, each after its own 1% change: the first run after a build is no
        # different in kind from later ones, several show the spread on a shared machine, and the
        # fourth pays the index's periodic compaction (so the figures include it).
        ratios = []
        for r in range(INCREMENTAL_RUNS):
            rewrite(f"changed-{r}")
            inc = IndexJob(spark, idx, url, FieldIndex("city")).run()
            ratios.append(inc.seconds / full.seconds)
            print(f"incremental run {r + 1} after 1% changed: {inc.rows_read} changes in {inc.seconds:.2f}s "
                  f"{inc.phases} = {inc.seconds / full.seconds:.1%} of the full build")
        print(f"incremental / full build: median {statistics.median(ratios):.1%} "
              f"(runs: {', '.join(f'{x:.1%}' for x in ratios)})")
        # The same 1% change applied by a long-running query (--follow): no per-run query start.
        import threading
        job = IndexJob(spark, idx, url, FieldIndex("city"))
        runner = threading.Thread(target=lambda: job.run(follow=True, interval_s=0.5, timeout_s=120), daemon=True)
        runner.start()
        before = job.manifest().batch_id
        time.sleep(8)    # let the query start and settle (its first trigger finds nothing new)
        settled = job.manifest().batch_id
        rewrite("changed-follow")
        t = time.perf_counter()
        # Done when a committed batch reaches every partition's high seqno after the writes (the
        # query may pick the change up in several batches: the first one alone is not "indexed").
        highs = {str(p["partition"]): p["high_seqno"] for p in httpx.get(url + "/partitions").json()["partitions"]}

        def caught_up() -> bool:
            m = job.manifest()
            done = (m.offset or {}).get("p", {}) if m and m.batch_id > settled else {}
            return all(done.get(p, {}).get("s", -1) >= h for p, h in highs.items())

        while not caught_up() and time.perf_counter() - t < 100:
            time.sleep(0.05)
        took = time.perf_counter() - t
        for q in spark.streams.active:
            q.stop()
        runner.join(30)
        print(f"--follow: 1% change indexed {took:.1f}s after the writes returned = {took / full.seconds:.0%} "
              f"of the full build (batches before/after settling/at the end: {before}/{settled}/"
              f"{job.manifest().batch_id})")
        from spark_connector.index.view import load_index
        view = load_index(spark, idx)
        got = {r["value"]: r["count"] for r in view.filter(view.value.startswith("changed-")).groupBy("value")
               .count().collect()}
        expected = {label: list(label_of.values()).count(label) for label in set(label_of.values())}
        print(f"check: index rows per rewrite label {dict(sorted(got.items()))} "
              f"({'equal to' if got == expected else 'DIFFERENT FROM'} the expected {dict(sorted(expected.items()))})")
        print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        spark.stop()
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
