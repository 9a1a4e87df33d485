"""CPU per small ``POST /docs/_bulk`` through the direct path (``app.fast_bulk``) against the full
ASGI stack, in one process, alternating: a load-independent measure of the per-request cost
around the bulk route.

The app runs in-process on a real engine (httpx's ASGI transport, no sockets), so the figures
include the client's own share, the same for both paths: compare the difference, not the ratio.
The full stack is forced by a dependency override of ``write_ctx`` (which the direct path
declines)::

    PYTHONPATH=. python -m bench.bulk_request_cpu --requests 2000 --rounds 3
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import orjson

from app.deps import write_ctx
from tests.support.asgi import in_process_app


async def _round(running: object, n: int, items: int, start: int) -> float:
    client = running.client  # type: ignore[attr-defined]
    bodies = [orjson.dumps([{"op": "set", "key": f"k{start + i}-{j}", "value": {"n": i}} for j in range(items)])
              for i in range(n)]
    cpu = time.process_time()
    for body in bodies:
        r = await client.post("/docs/_bulk", content=body)
        assert r.status_code == 200, r.text
    return (time.process_time() - cpu) / n


async def main_async(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="upr-bench-bulkcpu-"))
    try:
        async with in_process_app(work / "data", partitions=64) as running:
            await _round(running, 200, args.items, 10**9)  # warm-up
            for r in range(args.rounds):
                out = {}
                for path in ("direct", "full"):
                    if path == "full":
                        running.app.dependency_overrides[write_ctx] = write_ctx
                    else:
                        running.app.dependency_overrides.clear()
                    out[path] = await _round(running, args.requests, args.items, (r * 2 + len(out)) * args.requests)
                print(f"round {r + 1}: direct {out['direct'] * 1e6:.0f} µs, full stack {out['full'] * 1e6:.0f} µs "
                      f"of CPU per request ({args.items} items each); difference {(out['full'] - out['direct']) * 1e6:.0f} µs",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--items", type=int, default=3)
    asyncio.run(main_async(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
