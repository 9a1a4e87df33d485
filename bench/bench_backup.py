"""Backup benchmark: backup, verify and restore throughput beside the raw stream rate, in one run.

    .venv/bin/python -m bench.bench_backup            # default: 100k docs of 256 B, ~1 minute
    .venv/bin/python -m bench.bench_backup --full     # 1M docs

One server process (127.0.0.1, ephemeral port) is loaded with N documents, then, against that
same data:

1. raw stream: ``clients.Consumer.batches()`` from 0 "until now" over every partition, counting
   items and bytes and doing nothing else - the ceiling any stream-based backup can reach;
2. full backup: ``create_backup`` (the same stream, plus segment encoding, zlib level 1, CRCs,
   sha256, fsyncs, manifest);
3. incremental backup after 10 % of the docs were rewritten;
4. verify (re-read, decompress, check every record) and restore into a second, fresh server
   through ``POST /docs/_bulk``.

Compare the ratios (backup / raw stream); absolute figures move on a shared machine.  Values are
half random, half repetitive, so zlib has something (but not everything) to gain.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from bench.server import server_env, start_upr_server
from bench.suite.procs import ProcessGroup
from clients.backup.archive import Archive, disk_usage
from clients.backup.create import create_backup
from clients.backup.restore import restore
from clients.backup.verify import verify
from clients.consumer import Consumer
from clients.events import StreamEnd
from clients.state import MemoryStateStore
from engine.protocol.frames import ItemBatch

ROOT = Path(__file__).resolve().parents[1]


def start_server(group: ProcessGroup, workdir: Path, name: str, partitions: int) -> str:
    _, url = start_upr_server(workdir, name=name, partitions=partitions,
                              spawn=lambda argv, log: group.spawn(argv, name=name, log=log, cwd=ROOT, env=server_env()))
    return url


def load(url: str, keys: list[str], value_bytes: int, chunk: int = 2000) -> int:
    half = value_bytes // 2
    total = 0
    with httpx.Client(base_url=url, timeout=120) as c:
        for i in range(0, len(keys), chunk):
            ops = []
            for k in keys[i : i + chunk]:
                v = os.urandom(half) + b"x" * (value_bytes - half)
                total += len(k) + len(v)
                ops.append({"op": "set", "key": k, "value_b64": base64.b64encode(v).decode()})
            r = c.post("/docs/_bulk", json=ops, params={"durability": "persist" if i + chunk >= len(keys) else "memory"})
            r.raise_for_status()
    return total


async def raw_stream(url: str) -> tuple[int, int, float]:
    items = nbytes = 0
    t0 = time.perf_counter()
    async with Consumer(url, name="bench-raw", start="beginning", state=MemoryStateStore(), ring_size=0,
                        until_now=True) as consumer:
        async for ev in consumer.batches():
            if type(ev) is ItemBatch:
                items += len(ev.seqnos)
                nbytes += sum(map(len, ev.keys)) + sum(map(len, ev.values))
            elif isinstance(ev, StreamEnd):
                pass
    return items, nbytes, time.perf_counter() - t0


def row(name: str, items: int, nbytes: int, secs: float, extra: str = "") -> str:
    return (f"{name:<26} {items:>9,} items {secs:7.2f} s {items / secs:>11,.0f} items/s "
            f"{nbytes / secs / 1e6:8.1f} MB/s  {extra}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--value-bytes", type=int, default=256)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--full", action="store_true", help="1M docs")
    ap.add_argument("--no-restore", action="store_true", help="skip the restore step")
    ap.add_argument("--level", type=int, default=1, help="zlib level of the segments (0 = store)")
    args = ap.parse_args(argv)
    n = 1_000_000 if args.full else args.docs
    work = Path(tempfile.mkdtemp(prefix="bench-backup-"))
    try:
        with ProcessGroup() as group:
            url = start_server(group, work, "src", args.partitions)
            keys = [f"doc:{i:08d}" for i in range(n)]
            t = time.perf_counter()
            logical = load(url, keys, args.value_bytes)
            print(f"loaded {n:,} docs ({logical / 1e6:.1f} MB of keys+values) in {time.perf_counter() - t:.1f} s, "
                  f"{args.partitions} partitions")

            cpu = time.process_time()
            items, nbytes, secs = asyncio.run(raw_stream(url))
            cpu = time.process_time() - cpu
            print(row("raw stream (batches)", items, nbytes, secs, f"client CPU {cpu:.1f} s"))
            raw_rate = items / secs

            archive_dir = work / "archive"
            cpu = time.process_time()
            res = create_backup(archive_dir, url, level=args.level)
            cpu = time.process_time() - cpu
            full_items = res.mutations + res.deletions
            print(row("backup create (full)", full_items, nbytes, res.seconds,
                      f"= {full_items / res.seconds / raw_rate:.2f} x raw; archive {res.bytes / 1e6:.1f} MB "
                      f"({res.bytes / nbytes:.2f} of logical), client CPU {cpu:.1f} s"))

            upd = keys[:: 10]
            upd_bytes = load(url, upd, args.value_bytes)
            cpu = time.process_time()
            res2 = create_backup(archive_dir, url, level=args.level)
            cpu = time.process_time() - cpu
            print(row("backup create (incr 10%)", res2.mutations + res2.deletions, upd_bytes, res2.seconds,
                      f"archive +{res2.bytes / 1e6:.1f} MB, client CPU {cpu:.1f} s"))

            archive = Archive.open(archive_dir)
            t = time.perf_counter()
            report = verify(archive)
            vsecs = time.perf_counter() - t
            assert report.ok, report.problems
            print(row("verify", report.items, nbytes + upd_bytes, vsecs, f"{disk_usage(archive_dir) / 1e6:.1f} MB read"))

            if not args.no_restore:
                dst = start_server(group, work, "dst", args.partitions)
                rep = restore(archive, dst)
                print(row("restore (bulk API)", rep.sets + rep.deletes, nbytes, rep.seconds))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
