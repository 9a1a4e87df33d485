"""CPU per small ``POST /docs/_bulk`` on a real server over loopback, client and server apart.

Load-independent figures for the write path from a client's request to the write being
applied: the client process's CPU per request (the same requests sent by ``httpx.AsyncClient``
as the suite's writer sent them, by ``AsyncHttpApi`` over httpx, and by ``AsyncHttpApi`` over its
lean keep-alive transport) and the server process's CPU per request (``/proc``: every thread,
the loop's uvicorn + route, the writer thread's parse + apply, the flusher), for bulks of 1, 10
and 50 documents with ``durability=memory`` and ``persist``.  Requests go closed-loop with
``--inflight`` of them outstanding (1: one writer; more: concurrent writers, whose small bulks
the writer thread runs together).

``--server-tree DIR`` runs the server from another checkout (a ``git archive`` of main) with the
same clients, for before/after pairs.  ``--pyspy DIR`` records the server with py-spy (GIL
samples, per thread) during the lean client's rounds::

    PYTHONPATH=. python -m bench.bulk_hop_cpu --requests 2000
    PYTHONPATH=. python -m bench.bulk_hop_cpu --server-tree /tmp/before --requests 2000
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from clients.http import AsyncHttpApi

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ("httpx", "api-httpx", "api-lean")


def _body(prefix: str, n: int, i: int) -> bytes:
    return orjson.dumps([{"op": "set", "key": f"{prefix}-{i}-{j}", "value": {"n": i, "pad": "x" * 40}}
                         for j in range(n)])


async def _round(url: str, client: str, durability: str, size: int, requests: int, inflight: int,
                 server: psutil.Process, tag: str, idle: float) -> tuple[float, float]:
    bodies = [_body(tag, size, i) for i in range(requests)]
    params = {"durability": durability, "results": "columns"}
    raw = httpx.AsyncClient(base_url=url, timeout=60) if client == "httpx" else None
    api = AsyncHttpApi(url, timeout=60, lean=client == "api-lean") if raw is None else None
    it = iter(bodies)

    async def one(body: bytes) -> None:
        if raw is not None:
            resp = await raw.post("/docs/_bulk", params=params, content=body,
                                  headers={"content-type": "application/json"})
            out = orjson.loads(resp.content)
        else:
            assert api is not None
            out = await api.bulk_bytes(body, durability=durability, columns=True)
        if out.get("failed"):
            raise RuntimeError(f"bulk failed: {out}")

    async def lane() -> None:
        for body in it:
            await one(body)

    await one(_body(tag + "-warm", size, 0))  # the connection made outside the measurement
    s0, c0, t0 = server.cpu_times(), time.process_time(), time.monotonic()
    await asyncio.gather(*(lane() for _ in range(inflight)))
    c1, s1, t1 = time.process_time(), server.cpu_times(), time.monotonic()
    if raw is not None:
        await raw.aclose()
    if api is not None:
        await api.aclose()
    # the server's idle cost (its timers) over the round's wall time is not the requests'
    return (c1 - c0) / requests, (s1.user + s1.system - s0.user - s0.system - idle * (t1 - t0)) / requests


def _idle_rate(server: psutil.Process, seconds: float = 3.0) -> float:
    """The server's CPU seconds per second with nothing to do."""
    s0 = server.cpu_times()
    time.sleep(seconds)
    s1 = server.cpu_times()
    return (s1.user + s1.system - s0.user - s0.system) / seconds


def _start(tree: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    ready = work / "ready"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "server", "--data-dir", str(work / "data"),
                             "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready), "--log-level",
                             "warning"], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(work / "server.log", "wb"))
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"server did not start: {(work / 'server.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, ready.read_text().strip()


async def main_async(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="upr-bench-hop-"))
    proc, url = _start(args.server_tree.resolve(), work)
    server = psutil.Process(proc.pid)
    spy: subprocess.Popen[bytes] | None = None
    time.sleep(2)  # start-up done
    idle = _idle_rate(server)
    print(f"server tree {args.server_tree}, {args.requests} requests per cell, {args.inflight} in flight, "
          f"load {os.getloadavg()[0]:.1f}; server idle {idle * 100:.1f} % of a core (taken out of its figures)",
          flush=True)
    print(f"{'durability':<10} {'docs':>4} " + " ".join(f"{c + ' client':>15} {'server':>8}" for c in args.clients),
          flush=True)
    try:
        for r in range(args.rounds):
            for durability in args.durability:
                for size in args.sizes:
                    cells = []
                    for client in args.clients:
                        if args.pyspy and client == "api-lean" and spy is None:
                            args.pyspy.mkdir(parents=True, exist_ok=True)
                            exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                            spy = subprocess.Popen([exe, "record", "--gil", "--threads", "--format", "raw", "--nonblocking",
                                                    "-p", str(proc.pid), "-o", str(args.pyspy / "server.txt")],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                            time.sleep(1)
                        client_s, server_s = await _round(url, client, durability, size, args.requests, args.inflight,
                                                          server, f"r{r}-{durability}-{size}-{client}", idle)
                        cells.append(f"{client_s * 1e6:>13.0f}µs {server_s * 1e6:>6.0f}µs")
                    print(f"{durability:<10} {size:>4} " + " ".join(cells), flush=True)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--inflight", type=int, default=1)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 50])
    p.add_argument("--durability", type=lambda s: s.split(","), default=["memory", "persist"])
    p.add_argument("--clients", type=lambda s: s.split(","), default=list(CLIENTS),
                   help=f"which of {', '.join(CLIENTS)} (comma-separated)")
    p.add_argument("--server-tree", type=Path, default=ROOT)
    p.add_argument("--pyspy", type=Path, help="record the server with py-spy during the first lean round")
    asyncio.run(main_async(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
