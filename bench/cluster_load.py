"""A bulk-ingest load generator process for ``bench.bench_cluster`` (``python -m bench.cluster_load``).

Each process routes its keys to their partitions' active nodes itself (the map is given on the
command line: what a cluster-aware client does with ``GET /cluster``), builds its request bodies
before the clock starts (so the client's own CPU goes to sending, not to encoding), says
``ready`` and waits for its window (``bench.cluster_procs.release_together``: two
``time.monotonic()`` values, one clock for every process on the host), then keeps
``--concurrency`` bulk requests in flight per node from the moment it is released until the
window ends.  Only requests completed inside the window count (the time before it is warm-up).  It prints one
JSON line: items acknowledged, requests, errors (non-200 answers, item errors), the window.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import random
import sys
import time

import orjson

from bench.bench_http import RawConnection
from bench.cluster_procs import partition_of, wait_for_start


def routed_bodies(targets: dict[int, str], partitions: int, prefix: str, batch: int, per_node: int,
                  seed: int) -> dict[str, list[bytes]]:
    """``per_node`` bulk bodies of ``batch`` sets for each node, each key sent to its partition's node."""
    rnd = random.Random(seed)
    buckets: dict[str, list[dict[str, str]]] = {url: [] for url in set(targets.values())}
    bodies: dict[str, list[bytes]] = {url: [] for url in buckets}
    n = 0
    while any(len(b) < per_node for b in bodies.values()):
        key = f"{prefix}-{n}"
        n += 1
        url = targets[partition_of(key, partitions)]
        if len(bodies[url]) >= per_node:
            continue
        bucket = buckets[url]
        bucket.append({"op": "set", "key": key, "value_b64": base64.b64encode(rnd.randbytes(75)).decode()})
        if len(bucket) == batch:
            bodies[url].append(orjson.dumps(bucket))
            bucket.clear()
    return bodies


async def run(bodies: dict[str, list[bytes]], durability: str, concurrency: int, start_at: float,
              stop_at: float) -> dict[str, float]:
    counts = {"items": 0, "requests": 0, "errors": 0}
    target = f"/docs/_bulk?durability={durability}&results=columns"

    async def worker(url: str, offset: int) -> None:
        conn = await RawConnection.open(url)
        mine = bodies[url]
        i = offset
        try:
            while time.monotonic() < stop_at:
                status, body = await conn.request("POST", target, mine[i % len(mine)], "application/json")
                i += 1
                done = time.monotonic()
                if not start_at <= done <= stop_at:
                    continue
                counts["requests"] += 1
                if status != 200:
                    counts["errors"] += 1
                    continue
                answer = orjson.loads(body)
                counts["items"] += answer["succeeded"]
                counts["errors"] += len(answer.get("errors") or ())
        finally:
            conn.close()

    await asyncio.gather(*(worker(url, k) for url in bodies for k in range(concurrency)))
    return {**counts, "seconds": stop_at - start_at}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--targets", required=True, help='JSON {"partition": "node URL"} for every partition')
    p.add_argument("--durability", default="memory")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--bodies-per-node", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4, help="bulk requests in flight per node")
    p.add_argument("--prefix", default="load")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    targets = {int(k): v for k, v in orjson.loads(args.targets).items()}
    bodies = routed_bodies(targets, len(targets), args.prefix, args.batch, args.bodies_per_node, args.seed)
    start_at, stop_at = wait_for_start()
    result = asyncio.run(run(bodies, args.durability, args.concurrency, start_at, stop_at))
    print(orjson.dumps(result).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
