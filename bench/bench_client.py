"""Client-side throughput: the client library vs a raw WebSocket reader on the same stream, one run.

    .venv/bin/python -m bench.bench_client            # 200k items of 200 B (well under 2 minutes)
    .venv/bin/python -m bench.bench_client --full     # 1e6 items

A server process holds N persisted mutations; this process then streams all of them from the
beginning ("until now") several times, alternating the readers so that machine noise hits them
alike, and prints items/s for each and the ratios (median of the rounds):

* raw       websockets + hello/stream_request by hand; per binary frame it reads the item count from
            the header and acks the window; no decoding at all (the transport ceiling)
* batches   ``Consumer.batches()``: frames decoded into ``ItemBatch`` columns, positions, acks
* events    ``async for event in Consumer``: one ``Mutation`` per item to a no-op loop body
* handler   ``Consumer.run(noop)`` (events + a handler call per item)
* events+ring  as events, with the rollback ring kept in memory (100k entries)

Goal: events >= 80 % of raw.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import websockets

from bench.bench_backup import load, start_server
from bench.suite.procs import ProcessGroup
from clients.consumer import Consumer, stream_url
from clients.state import MemoryStateStore

WINDOW = 16 << 20


async def raw(url: str) -> int:
    items = 0
    async with websockets.connect(stream_url(url), max_size=None, compression=None) as ws:
        await ws.send(json.dumps({"type": "hello", "name": "bench-raw", "partitions": None, "codec": "binary",
                                  "window_bytes": WINDOW, "protocol": 1}))
        logs = json.loads(await ws.recv())
        unacked = 0
        ends = 0
        for p, info in logs["partitions"].items():
            await ws.send(json.dumps({"type": "stream_request", "partition": int(p), "uuid": 0, "start_seqno": 0,
                                      "snap_start": 0, "snap_end": 0, "end_seqno": info["high_seqno"]}))
        want = len(logs["partitions"])
        threshold = WINDOW // 5
        while ends < want:
            frame = await ws.recv()
            unacked += len(frame)
            if type(frame) is bytes:
                items += int.from_bytes(frame[8:12], "little")
            elif '"stream_end"' in frame:
                ends += 1
            if unacked >= threshold:
                await ws.send('{"type":"ack","bytes":%d}' % unacked)
                unacked = 0
    return items


def _consumer(url: str, ring_size: int = 0) -> Consumer:
    return Consumer(url, name="bench-client", start="beginning", state=MemoryStateStore(), ring_size=ring_size,
                    until_now=True, window_bytes=WINDOW)


async def batches(url: str) -> int:
    async with _consumer(url) as c:
        async for _ in c.batches():
            pass
    return c.items_processed


async def events(url: str) -> int:
    async with _consumer(url) as c:
        async for _ in c:
            pass
    return c.items_processed


async def events_ring(url: str) -> int:
    async with _consumer(url, ring_size=100_000) as c:
        async for _ in c:
            pass
    return c.items_processed


async def handler(url: str) -> int:
    async with _consumer(url) as c:
        await c.run(lambda event: None)
    return c.items_processed


READERS = {"raw": raw, "batches": batches, "events": events, "handler": handler, "events+ring": events_ring}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="1e6 items instead of 2e5")
    ap.add_argument("--items", type=int, default=None)
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    n = args.items or (1_000_000 if args.full else 200_000)
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp, ProcessGroup() as group:
        work = Path(tmp)
        url = start_server(group, work, "server", args.partitions)
        server = psutil.Process(group.pids[-1])

        def server_cpu() -> float:
            t = server.cpu_times()
            return t.user + t.system
        t0 = time.perf_counter()
        load(url, [f"key-{i:09d}" for i in range(n)], args.value_bytes)
        print(f"loaded {n:,} mutations of {args.value_bytes} B in {time.perf_counter() - t0:.1f} s "
              f"({args.partitions} partitions); {args.rounds} rounds, readers alternate", flush=True)
        rates: dict[str, list[float]] = {name: [] for name in READERS}
        cpu: dict[str, list[float]] = {name: [] for name in READERS}
        scpu: dict[str, list[float]] = {name: [] for name in READERS}
        for r in range(args.rounds):
            order = list(READERS) if r % 2 == 0 else list(reversed(READERS))
            for name in order:
                t, c, sc = time.perf_counter(), time.process_time(), server_cpu()
                got = asyncio.run(READERS[name](url))
                secs, csecs = time.perf_counter() - t, time.process_time() - c
                scpu[name].append((server_cpu() - sc) / n * 1e6)
                if got != n:
                    print(f"{name}: expected {n} items, got {got}", file=sys.stderr)
                    return 1
                rates[name].append(n / secs)
                cpu[name].append(csecs / n * 1e6)
        base = statistics.median(rates["raw"])
        med_s = statistics.median(x for xs in scpu.values() for x in xs)
        proj = {name: 1e6 / max(statistics.median(cpu[name]), med_s) for name in READERS}
        print(f"{'reader':<12} {'items/s':>10} {'vs raw':>7} {'client us/item':>15} {'server us/item':>15} "
              f"{'1 core each':>12} {'vs raw':>7}   rounds (items/s)")
        for name, rs in rates.items():
            med = statistics.median(rs)
            print(f"{name:<12} {med:>10,.0f} {med / base:>7.0%} {statistics.median(cpu[name]):>15.2f} "
                  f"{statistics.median(scpu[name]):>15.2f} {proj[name]:>12,.0f} {proj[name] / proj['raw']:>7.0%}   "
                  + " ".join(f"{x:,.0f}" for x in rs))
        print("items/s: wall-clock median of the rounds.  us/item: CPU time per item of this process (client) and\n"
              "of the server process in the same read.  '1 core each': the rate if client and server each had a\n"
              "core of their own, 1/max(client, server CPU per item) with the median server cost: on a shared,\n"
              "loaded machine the CPU figures are steadier than the wall-clock ones.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
