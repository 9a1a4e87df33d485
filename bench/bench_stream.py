"""Stream benchmark: the WebSocket stream server against its limits, in one run.

    .venv/bin/python -m bench.bench_stream            # default sizes, well under 2 minutes
    .venv/bin/python -m bench.bench_stream --full     # 1e6-item backfill, longer tail/fan-out runs
    .venv/bin/python -m bench.bench_stream --only backfill   # or tail, fanout

Figures printed (compare ratios measured in the same run; absolute numbers move on shared machines):

1. **backfill**: N persisted 200-byte mutations (64 partitions) streamed from a real ``upr server``
   process to one Python consumer in another process (binary codec, every frame decoded with
   ``frames.decode_binary``), from the first stream request until a barrier cookie sent right
   after the requests comes back (= every partition fully sent).  Beside it, in this process, the
   limit: a raw LMDB cursor scan of the same items encoded into the same binary frames (the
   items are read back through the engine into a separate plain LMDB env, one record per item in
   seqno order: the engine's format-2 blocks are not a per-item scan), and the consumer-side
   decode of those frames alone.
2. **tail**: latency from write acknowledgement (``POST /docs/_bulk`` answered) to receipt by a
   tailing consumer process, paced at 2,500 and 10,000 writes/s (small bulk batches every ms).
3. **fanout**: 50 consumers (in 5 processes) tail all partitions while a writer sustains 20,000
   writes/s; per consumer the worst delay behind the writer, and the aggregate delivery rate.

Timestamps are ``time.monotonic_ns()`` (CLOCK_MONOTONIC, shared by all processes on the machine).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.server import start_upr_server
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 64
VALUE = b"x" * 200


# ============================================================================ consumer process


async def _consumer(url: str, mode: str, connections: int, seconds: float, out_path: str,
                    bundle: bool = True) -> None:
    """Runs in a child process: ``backfill`` (stream everything, then report) or ``tail``
    (stream from now, record receipt times of keys starting with ``lat-``).  With ``bundle`` the
    hello accepts bundle frames (as ``clients.Consumer`` does) and every part is handled."""
    from websockets.asyncio.client import connect

    from engine.protocol.bundle import BUNDLE_MAGIC, decode_bundle
    from engine.protocol.frames import decode_binary

    ws_url = url.replace("http://", "ws://") + "/stream"
    results: list[dict[str, Any]] = []

    async def one(index: int) -> None:
        ws = await connect(ws_url, compression=None, max_size=None, max_queue=64)
        await ws.send(json.dumps({"type": "hello", "name": f"bench-{mode}-{index}", "codec": "binary",
                                  "window_bytes": 16 << 20, "protocol": 1,
                                  **({"bundle": True} if bundle else {})}))
        hello = json.loads(await ws.recv())
        parts = hello["partitions"]
        unacked = 0
        items = 0
        messages = 0
        t0 = time.perf_counter()
        c0 = time.process_time()
        for p, info in parts.items():
            start = 0 if mode == "backfill" else info["high_seqno"]
            uuid = info["log"][0][0]
            await ws.send(json.dumps({"type": "stream_request", "partition": int(p), "uuid": uuid,
                                      "start_seqno": start, "snap_start": start, "snap_end": start}))
        if mode == "backfill":
            await ws.send(json.dumps({"type": "barrier", "cookie": "all"}))
        receipts: dict[str, int] = {}
        frames: list[tuple[str, int, int]] = []
        deadline = time.monotonic() + seconds
        while True:
            try:
                data = await asyncio.wait_for(ws.recv(), timeout=max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                if mode != "backfill":
                    break
                raise
            unacked += len(data)
            messages += 1
            if unacked >= 1 << 20:
                await ws.send(json.dumps({"type": "ack", "bytes": unacked}))
                unacked = 0
            parts = decode_bundle(data) if isinstance(data, bytes) and data[:4] == BUNDLE_MAGIC else (data,)
            done = False
            for part in parts:
                if isinstance(part, bytes):
                    batch = decode_binary(part)
                    items += len(batch)
                    if mode == "tail":
                        now = time.monotonic_ns()
                        for key in batch.keys:
                            if key.startswith(b"lat-"):
                                receipts[key.decode()] = now
                    elif mode == "fan" and len(batch):
                        # per frame only: its oldest write bounds the delay of every item in it
                        frames.append((batch.keys[0].decode(), len(batch), time.monotonic_ns()))
                elif mode == "backfill" and '"barrier"' in part:
                    done = True
            if done:
                break
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        await ws.close()
        results.append({"items": items, "seconds": elapsed, "cpu_seconds": cpu, "receipts": receipts,
                        "frames": frames, "messages": messages})

    await asyncio.gather(*(one(i) for i in range(connections)))
    Path(out_path).write_text(json.dumps(results))


# ============================================================================ helpers


def start_server(workdir: Path, data_dir: Path, extra: list[str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    return start_upr_server(workdir, data_dir=data_dir, partitions=PARTITIONS, extra=extra or ())


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


BUNDLE = True  # consumers accept bundle frames (--no-bundle: one message per WebSocket message)


def spawn_consumers(url: str, mode: str, connections: int, seconds: float, workdir: Path,
                    tag: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = workdir / f"consumer-{tag}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.bench_stream", "--role", "consumer", "--url", url, "--mode", mode,
           "--connections", str(connections), "--seconds", str(seconds), "--out", str(out)]
    if not BUNDLE:
        cmd.append("--no-bundle")
    return subprocess.Popen(cmd, cwd=ROOT), out


def load(data_dir: Path, count: int) -> None:
    """N persisted 200-byte mutations, written straight through the engine (fast setup)."""
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.core.types import Op, WriteOp

    with Engine.open(EngineConfig(data_dir=data_dir, partitions=PARTITIONS)) as engine:
        for b in range(0, count, 1000):
            engine.write_batch([WriteOp(Op.MUTATION, f"key-{i:010d}", VALUE) for i in range(b, min(count, b + 1000))])
        engine.flush_now()


RAW_META = struct.Struct(">QQQ?")  # seqno, cas, rev, deleted: the per-item key prefix of the raw env


def write_raw_copy(data_dir: Path, raw_dir: Path) -> int:
    """The limit's input: the same items, read back through the engine (every partition's
    snapshot from seqno 0, exactly what the stream sends), written into a separate plain LMDB
    env with one record per item in a per-partition tree ``s<p>``:
    ``seqno, cas, rev, deleted (big-endian) + key -> value`` (seqno order = key order).

    WHY a copy: the engine's own data dir (format 2) stores blocks of up to 1024 items as
    columns, so a cursor over it is not "a raw LMDB scan of the items"; the limit the issue asks
    for is a raw per-item cursor scan plus encoding, so it gets a per-item tree of the same items.
    Returns the item count."""
    import lmdb

    from engine.config import EngineConfig
    from engine.engine import Engine

    env = lmdb.open(str(raw_dir), map_size=1 << 34, max_dbs=PARTITIONS + 1, subdir=True, sync=False)
    n = 0
    with Engine.open(EngineConfig(data_dir=data_dir, partitions=PARTITIONS)) as engine:
        for p in range(PARTITIONS):
            db = env.open_db(b"s%d" % p)
            with engine.snapshot(p, 0) as snap, env.begin(write=True, db=db) as txn:
                rows = [(RAW_META.pack(it.seqno, it.cas, it.rev, it.deleted) + it.key, it.value)
                        for it in snap.items()]
                txn.cursor().putmulti(rows, append=True)
                n += len(rows)
    env.sync(True)
    env.close()
    return n


def raw_limit(raw_dir: Path) -> tuple[int, float, float, float, float]:
    """Raw LMDB cursor scan of every per-item by-seqno tree of ``write_raw_copy``, encoded into
    the binary frame format, ~64 KiB per frame, then decoded; returns (items, scan+encode wall s,
    cpu s, decode wall s, cpu s)."""
    import lmdb

    from engine.protocol.frames import decode_binary, encode_binary
    from engine.core.types import Item

    meta = RAW_META
    ms = meta.size
    new = tuple.__new__
    env = lmdb.open(str(raw_dir), readonly=True, lock=False, max_dbs=PARTITIONS + 1, subdir=True)
    dbs = [env.open_db(b"s%d" % p, create=False) for p in range(PARTITIONS)]
    items = 0
    frames: list[bytes] = []
    t0 = time.perf_counter()
    c0 = time.process_time()
    with env.begin(buffers=False) as txn:
        for p, db in enumerate(dbs):
            batch: list[Item] = []
            nbytes = 0
            for k, v in txn.cursor(db).iternext():
                seqno, cas, rev, deleted = meta.unpack_from(k)
                batch.append(new(Item, (k[ms:], seqno, cas, rev, deleted, v)))
                nbytes += len(v)
                if nbytes >= 64 * 1024:
                    frames.append(encode_binary(p, batch, False))
                    items += len(batch)
                    batch, nbytes = [], 0
            if batch:
                frames.append(encode_binary(p, batch, True))
                items += len(batch)
    scan = time.perf_counter() - t0
    scan_cpu = time.process_time() - c0
    env.close()
    t0 = time.perf_counter()
    c0 = time.process_time()
    decoded = 0
    for f in frames:
        decoded += len(decode_binary(f))
    decode = time.perf_counter() - t0
    decode_cpu = time.process_time() - c0
    assert decoded == items
    return items, scan, scan_cpu, decode, decode_cpu


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ============================================================================ benchmarks


def bench_backfill(workdir: Path, count: int) -> dict[str, Any]:
    data_dir = workdir / "backfill-data"
    load(data_dir, count)
    import psutil

    raw_dir = workdir / "backfill-raw-lmdb"
    copied = write_raw_copy(data_dir, raw_dir)
    raw_limit(raw_dir)  # warm the page cache, as the server's read will find it
    items, scan_s, scan_cpu, decode_s, decode_cpu = raw_limit(raw_dir)
    assert items == copied, (items, copied)
    proc, url = start_server(workdir, data_dir)
    try:
        server = psutil.Process(proc.pid)
        before = server.cpu_times()
        consumer, out = spawn_consumers(url, "backfill", 1, 600, workdir, "backfill")
        consumer.wait(timeout=600)
        after = server.cpu_times()
        result = json.loads(out.read_text())[0]
    finally:
        stop_server(proc)
    server_cpu = (after.user + after.system) - (before.user + before.system)
    assert result["items"] == count == items, (result["items"], count, items)
    stream_rate = result["items"] / result["seconds"]
    limit_rate = items / scan_s
    return {
        "items": count,
        "stream_rate": stream_rate,
        "limit_scan_encode_rate": limit_rate,
        "limit_decode_rate": items / decode_s,
        "ratio_vs_scan_encode": stream_rate / limit_rate,
        "stream_seconds": result["seconds"],
        "server_cpu_rate": count / server_cpu,
        "consumer_cpu_rate": count / result["cpu_seconds"],
        "limit_scan_encode_cpu_rate": items / scan_cpu,
        "limit_decode_cpu_rate": items / decode_cpu,
    }


WRITER_LATENCIES: list[float] = []  # seconds per bulk request of the last _paced_writer run


def _paced_writer(url: str, rate: int, seconds: float, prefix: str, tick_s: float = 0.004) -> dict[str, int]:
    """Writes ``rate`` keys/s as one small bulk batch every ``tick_s`` (catching up with a bigger
    batch when behind, sleeping, never spinning, in between); returns each key's ack time.
    ``WRITER_LATENCIES`` gets each request's round trip (a writer short of its rate waited for them)."""
    import httpx

    acks: dict[str, int] = {}
    n = 0
    WRITER_LATENCIES.clear()
    with httpx.Client(base_url=url, timeout=30) as client:
        start = time.monotonic()
        while True:
            elapsed = time.monotonic() - start
            if elapsed >= seconds:
                break
            due = min(2000, int(elapsed * rate) + 1 - n)
            if due <= 0:
                time.sleep(tick_s)
                continue
            batch = [{"op": "set", "key": f"{prefix}-{n + i}", "value_b64": "eHh4eA=="} for i in range(due)]
            t0 = time.monotonic_ns()
            client.post("/docs/_bulk", json=batch).raise_for_status()
            t = time.monotonic_ns()
            WRITER_LATENCIES.append((t - t0) / 1e9)
            for item in batch:
                acks[item["key"]] = t
            n += due
            time.sleep(tick_s)
    return acks


def _delivery_histogram(url: str) -> dict[str, float]:
    """Server side: fraction of visits whose notification -> first frame sent took <= 1 / 5 ms
    (``upr_stream_delivery_seconds``, cumulative since the server started)."""
    import httpx

    buckets: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("upr_stream_delivery_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets[le] = float(line.split()[-1])
    total = buckets.get("+Inf", 0.0) or 1.0
    return {"1ms": buckets.get("0.001", 0.0) / total, "5ms": buckets.get("0.005", 0.0) / total}


def bench_tail(workdir: Path, rates: list[int], seconds: float) -> list[dict[str, Any]]:
    data_dir = workdir / "tail-data"
    proc, url = start_server(workdir, data_dir)
    out: list[dict[str, Any]] = []
    try:
        for rate in rates:
            consumer, path = spawn_consumers(url, "tail", 1, seconds + 4, workdir, f"tail-{rate}")
            time.sleep(2.0)  # connected and tailing
            acks = _paced_writer(url, rate, seconds, f"lat-{rate}")
            consumer.wait(timeout=120)
            receipts = json.loads(path.read_text())[0]["receipts"]
            lat = [(receipts[k] - t) / 1e6 for k, t in acks.items() if k in receipts]
            within = _delivery_histogram(url)
            out.append({
                "server_within": within,
                "rate": rate, "writes": len(acks), "achieved_rate": len(acks) / seconds,
                "received": len(lat), "p50_ms": percentile(lat, 0.50), "p99_ms": percentile(lat, 0.99),
                "max_ms": max(lat) if lat else float("nan"),
            })
    finally:
        stop_server(proc)
    return out


def bench_fanout(workdir: Path, consumers: int, rate: int, seconds: float) -> dict[str, Any]:
    data_dir = workdir / "fanout-data"
    proc, url = start_server(workdir, data_dir)
    try:
        import psutil

        procs = [spawn_consumers(url, "fan", consumers // 5, seconds + 6, workdir, f"fan-{i}") for i in range(5)]
        time.sleep(3.0)
        server = psutil.Process(proc.pid)
        c0, w0 = server.cpu_times(), time.monotonic()
        acks = _paced_writer(url, rate, seconds, "lat-fan")
        c1, w1 = server.cpu_times(), time.monotonic()
        server_util = ((c1.user + c1.system) - (c0.user + c0.system)) / (w1 - w0)
        worst: list[float] = []
        total = 0
        messages = 0
        complete = 0
        consumer_cpu = 0.0
        for consumer, path in procs:
            consumer.wait(timeout=300)
            results = json.loads(path.read_text())
            consumer_cpu += max(r["cpu_seconds"] / r["seconds"] for r in results)  # one process's CPU share
            for r in results:
                got = sum(n for _, n, _ in r["frames"])
                total += got
                messages += r["messages"]
                complete += got == len(acks)
                lags = [(t - acks[k]) / 1e9 for k, _, t in r["frames"] if k in acks]
                worst.append(max(lags) if lags else float("inf"))
        c2 = server.cpu_times()  # consumers done: the server's CPU for the whole delivery
    finally:
        stop_server(proc)
    return {
        "consumers": consumers, "rate": rate, "writes": len(acks), "achieved_rate": len(acks) / seconds,
        "consumers_complete": complete, "worst_delay_s_max": max(worst), "worst_delay_s_median": percentile(worst, 0.5),
        "aggregate_delivery_rate": total / seconds, "server_cpu_util": server_util,
        "items_per_message": total / max(messages, 1),
        "consumer_cpu_util": consumer_cpu,
        "writer_request_ms": (percentile(WRITER_LATENCIES, 0.5) * 1e3, percentile(WRITER_LATENCIES, 0.99) * 1e3),
        "server_us_per_delivery": ((c2.user + c2.system) - (c0.user + c0.system)) / max(total, 1) * 1e6,
    }


# ============================================================================ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="1e6-item backfill, longer tail and fan-out runs")
    ap.add_argument("--items", type=int, default=None, help="backfill size (default 200k, --full 1e6)")
    ap.add_argument("--only", choices=["backfill", "tail", "fanout"], action="append")
    ap.add_argument("--no-bundle", action="store_true",
                    help="consumers do not accept bundle frames (hello bundle false), for A/B runs")
    ap.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--connections", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=10, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "consumer":
        asyncio.run(_consumer(args.url, args.mode, args.connections, args.seconds, args.out, not args.no_bundle))
        return 0
    global BUNDLE
    BUNDLE = not args.no_bundle
    only = set(args.only or ["backfill", "tail", "fanout"])
    count = args.items or (1_000_000 if args.full else 200_000)
    tail_s = 10.0 if args.full else 4.0
    fan_s = 10.0 if args.full else 5.0
    workdir = Path(tempfile.mkdtemp(prefix="upr-bench-stream-"))
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores; bundles {'on' if BUNDLE else 'off'}; "
          f"workdir {workdir}")
    try:
        if "backfill" in only:
            r = bench_backfill(workdir, count)
            print(f"backfill {r['items']:,} x 200 B persisted mutations, 64 partitions, one consumer process:")
            print("                                          wall k items/s   per CPU-second")
            print(f"  streamed + decoded by the consumer   {r['stream_rate'] / 1e3:8.0f}"
                  f"   server {r['server_cpu_rate'] / 1e3:6.0f} k, consumer {r['consumer_cpu_rate'] / 1e3:6.0f} k"
                  f"   ({r['stream_seconds']:.2f} s)")
            print(f"  limit: raw LMDB scan + encode frames {r['limit_scan_encode_rate'] / 1e3:8.0f}"
                  f"   {r['limit_scan_encode_cpu_rate'] / 1e3:6.0f} k")
            print(f"  limit: decode the same frames only   {r['limit_decode_rate'] / 1e3:8.0f}"
                  f"   {r['limit_decode_cpu_rate'] / 1e3:6.0f} k")
            print(f"  stream / scan+encode limit           {r['ratio_vs_scan_encode'] * 100:8.0f} % wall, "
                  f"{r['server_cpu_rate'] / r['limit_scan_encode_cpu_rate'] * 100:.0f} % per CPU-second (server side)")
        if "tail" in only:
            for r in bench_tail(workdir, [2_500, 10_000], tail_s):
                print(f"tail at {r['rate']:,}/s (achieved {r['achieved_rate']:,.0f}/s, {r['received']:,}/"
                      f"{r['writes']:,} received): write-ack -> receipt p50 {r['p50_ms']:.2f} ms, "
                      f"p99 {r['p99_ms']:.2f} ms, max {r['max_ms']:.1f} ms; server side (notification -> "
                      f"frame sent, all runs so far): {r['server_within']['1ms'] * 100:.0f} % <= 1 ms, "
                      f"{r['server_within']['5ms'] * 100:.0f} % <= 5 ms")
        if "fanout" in only:
            r = bench_fanout(workdir, 50, 20_000, fan_s)
            print(f"fan-out: {r['consumers']} consumers, writer at {r['rate']:,}/s (achieved "
                  f"{r['achieved_rate']:,.0f}/s): {r['consumers_complete']}/{r['consumers']} got every write; "
                  f"worst delay behind the writer: max {r['worst_delay_s_max']:.2f} s, median "
                  f"{r['worst_delay_s_median']:.2f} s; aggregate delivery {r['aggregate_delivery_rate'] / 1e3:,.0f} "
                  f"k items/s ({r['items_per_message']:.0f} per WebSocket message); server process CPU {r['server_cpu_util'] * 100:.0f} % of one core, the 5 consumer "
                  f"processes {r['consumer_cpu_util'] * 100:.0f} % together; server CPU per delivered item "
                  f"{r['server_us_per_delivery']:.2f} us (writes included); writer's bulk requests p50 "
                  f"{r['writer_request_ms'][0]:.1f} ms, p99 {r['writer_request_ms'][1]:.1f} ms")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
