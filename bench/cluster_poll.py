"""A replica poller process for ``bench.bench_cluster``'s replication lag (``python -m bench.cluster_poll``).

It reads ``GET /partitions`` of each given node (one request in flight per node, a pause of
``--interval-ms`` between two; its own process so that the writer's event loop does not delay
it) and keeps the high seqnos of the partitions the node holds as a replica.  It says ``ready``,
is released with a window (``bench.cluster_procs.release_together``), polls from the window's
start until a ``stop`` line on stdin (the benchmark sends it once the replicas hold every
acknowledged write, or gives up) or ``--max-seconds`` past the window's end.  Only polls that
show a change are printed (the first poll covering a seqno always shows one, so the lags
computed from them are the same), with the count and median period of all polls: the method's
resolution.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from typing import Any

import orjson

from bench.bench_http import RawConnection
from bench.cluster_procs import wait_for_start


async def poll_node(url: str, start_at: float, stopped: threading.Event, deadline: float,
                    interval: float) -> dict[str, Any]:
    conn = await RawConnection.open(url)
    changed: list[tuple[float, float, dict[int, int]]] = []
    received: list[float] = []
    last: dict[int, int] | None = None
    try:
        while time.monotonic() < start_at:
            await asyncio.sleep(0.001)
        while not stopped.is_set():
            sent = time.monotonic()
            if sent >= deadline:
                break
            if received and sent < received[-1] + interval:
                await asyncio.sleep(received[-1] + interval - sent)
                sent = time.monotonic()
            status, body = await conn.request("GET", "/partitions")
            done = time.monotonic()
            if status != 200:
                raise RuntimeError(f"GET {url}/partitions answered {status}: {body[:200]!r}")
            highs = {p["partition"]: p["high_seqno"] for p in orjson.loads(body)["partitions"]
                     if p["state"] == "replica"}
            received.append(done)
            if highs != last:
                changed.append((sent, done, highs))
                last = highs
    finally:
        conn.close()
    gaps = [b - a for a, b in zip(received, received[1:])]
    return {"polls": changed, "count": len(received), "period": statistics.median(gaps) if gaps else None}


async def run(urls: list[str], start_at: float, stopped: threading.Event, deadline: float,
              interval: float) -> dict[str, Any]:
    results = await asyncio.gather(*(poll_node(u, start_at, stopped, deadline, interval) for u in urls))
    return dict(zip(urls, results))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("urls", nargs="+", help="node URLs to poll")
    p.add_argument("--interval-ms", type=float, default=0.0,
                   help="at least this long between the end of one poll and the next (0: back to back)")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="stop this long after the window's end even without a stop line")
    args = p.parse_args(argv)
    start_at, stop_at = wait_for_start()
    stopped = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()  # a stop line, or EOF when the benchmark went away
        stopped.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    out = asyncio.run(run(args.urls, start_at, stopped, stop_at + args.max_seconds, args.interval_ms / 1000))
    sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
