"""CPU per small bulk of each server thread, in one process: the loop, the writer, the flusher.

``bench.bulk_hop_cpu`` measures whole processes over loopback; there the flusher's share moves
with how many requests share one of its rounds (the request rate, which the machine's load
sets), and it swamps the thread hop.  Here the app runs in-process (httpx's ASGI transport: no
uvicorn, the client's share on the loop thread, the same in both trees) and each thread's own
CPU clock is read (``time.pthread_getcpuclockid``), so the writer thread's side of the hop (its
wake-up, the job, handing the result back) and the loop's side (queueing the job, the wake-up
back, settling) are apart from the flusher's rounds.  Run it with another tree first on
``PYTHONPATH`` for the "before" figures::

    PYTHONPATH=. python -m bench.bulk_thread_cpu --requests 1000 --inflight 1,4
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import orjson

from tests.support.asgi import in_process_app


def _clock(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _threads() -> dict[str, threading.Thread]:
    found = {}
    for t in threading.enumerate():
        if t is threading.main_thread():
            found["loop"] = t
        elif t.name.startswith("upr-writer"):
            found["writer"] = t
        elif t.name.startswith("upr-flusher"):
            found["flusher"] = t
    return found


async def _cell(client: object, durability: str, size: int, requests: int, inflight: int, tag: str) -> dict[str, float]:
    bodies = iter([orjson.dumps([{"op": "set", "key": f"{tag}-{i}-{j}", "value": {"n": i}} for j in range(size)])
                   for i in range(requests)])

    async def lane() -> None:
        for body in bodies:
            r = await client.post("/docs/_bulk", content=body,  # type: ignore[attr-defined]
                                  params={"durability": durability, "results": "columns"})
            assert r.status_code == 200, r.text

    r = await client.post("/docs/_bulk", content=b'[{"op":"set","key":"warm","value":1}]')  # type: ignore[attr-defined]
    assert r.status_code == 200
    threads = _threads()
    before = {name: _clock(t) for name, t in threads.items()}
    await asyncio.gather(*(lane() for _ in range(inflight)))
    return {name: (_clock(t) - before[name]) / requests for name, t in threads.items()}


async def main_async(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="upr-bench-threadcpu-"))
    try:
        async with in_process_app(work / "data", partitions=64) as running:
            print(f"load {os.getloadavg()[0]:.1f}; {args.requests} requests per cell; µs of CPU per request", flush=True)
            print(f"{'inflight':>8} {'durability':<10} {'docs':>4} {'loop':>7} {'writer':>7} {'flusher':>7}", flush=True)
            for inflight in args.inflight:
                for durability in args.durability:
                    for size in args.sizes:
                        cpu = await _cell(running.client, durability, size, args.requests, inflight,
                                          f"{inflight}-{durability}-{size}")
                        print(f"{inflight:>8} {durability:<10} {size:>4} {cpu.get('loop', 0) * 1e6:>7.0f} "
                              f"{cpu.get('writer', 0) * 1e6:>7.0f} {cpu.get('flusher', 0) * 1e6:>7.0f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--inflight", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 50])
    p.add_argument("--durability", type=lambda s: s.split(","), default=["memory", "persist"])
    asyncio.run(main_async(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
