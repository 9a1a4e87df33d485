"""A node's CPU per small write request, thread by thread, at the tail's shape.

WHY: on a shared two-core machine the tail's wall-clock latencies are the machine's, but the CPU
each server thread spends per request, and the context switches it makes per request, hardly
move with the load: they are the yardstick for cutting the per-request cost that the tail
(send -> receipt) and a replicating node's bulks queue behind.

One ``upr server`` (``python -m app.cli server`` from ``--root``, default this tree, so an
older tree from ``git archive`` can be measured with this same script), ``--consumers``
``clients.Consumer``s tailing from now, and one paced writer of ``--per``-document bulks at
``--rps`` requests per second with ``--durability``.  Before and after the timed window it reads
``/proc/PID/task/*/stat`` and ``status`` (utime + stime, voluntary and involuntary switches) of
every server thread and prints, per thread name, CPU per request, its share of a core and the
switches per request; then the total per request and per document.

    PYTHONPATH=$PWD python -m bench.thread_cpu                       # memory, 1 consumer, 250/s
    PYTHONPATH=$PWD python -m bench.thread_cpu --durability persist
    PYTHONPATH=$PWD python -m bench.thread_cpu --consumers 50 --rps 100
    PYTHONPATH=$PWD python -m bench.thread_cpu --root /tmp/before    # the same bench, another tree
    PYTHONPATH=$PWD python -m bench.thread_cpu --spy /tmp/loop.txt   # + py-spy --gil of the window

``THREAD_CPU_PATH`` is put in front of the server's ``PYTHONPATH`` (e.g. a ``sitecustomize`` with
an audit hook that counts what the server compiles while it serves).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.suite.ports import free_port
from bench.thread_stats import python_thread_names, thread_stats

HERE = Path(__file__).resolve().parent.parent


def threads(pid: int) -> dict[int, tuple[str, float, int, int, float]]:
    """tid -> (name, CPU seconds, voluntary switches, involuntary switches, of which system)."""
    return {tid: tuple(t) for tid, t in thread_stats(pid).items()}  # type: ignore[misc]


def _role(name: str, tid: int, pid: int, names: dict[int, str]) -> str:
    if tid == pid:
        return "MainThread (loop)"
    return names.get(tid, name)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from clients import Consumer
    from clients.http import AsyncHttpApi

    port = free_port()
    data = tempfile.mkdtemp(prefix="thread_cpu_")
    root = Path(args.root).resolve() if args.root else HERE
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (os.environ.get("THREAD_CPU_PATH"), str(root))))}
    cmd = [sys.executable, "-m", "app.cli", "server", "--data-dir", data, "--host", "127.0.0.1",
           "--port", str(port), *args.server_args.split()]
    log = open(os.path.join(data, "server.log"), "w")
    srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root))
    url = f"http://127.0.0.1:{port}"
    api = AsyncHttpApi(url, timeout=60)
    got = 0
    spy: subprocess.Popen[bytes] | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        for _ in range(600):
            try:
                await api._json("GET", "/health")
                break
            except Exception:
                if srv.poll() is not None:
                    raise RuntimeError(f"server exited {srv.returncode}; log in {data}") from None
                await asyncio.sleep(0.1)

        async def consume(i: int) -> None:
            nonlocal got
            async with Consumer(url, name=f"thr{i}", start="now") as cons:
                async for ev in cons:
                    if type(ev).__name__ == "Mutation":
                        got += 1

        tasks = [asyncio.create_task(consume(i)) for i in range(args.consumers)]
        await asyncio.sleep(2.0)
        # warm-up: a second of the same load before the window
        n = i = 0
        secs, rps, per = args.secs, args.rps, args.per
        before: dict[int, tuple[str, float, int, int, float]] = {}
        start = time.monotonic()
        window_start = start + args.warmup
        counted = -1
        while True:
            now = time.monotonic()
            if counted < 0 and now >= window_start:
                before, counted, got, w0 = threads(srv.pid), 0, 0, now
                if args.spy:
                    spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(srv.pid),
                                            "-r", "200", "-d", str(int(secs)), "-f", "raw", "--threads", "--gil", "-o", args.spy],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if counted >= 0 and now - w0 >= secs:
                break
            due = int((now - start) * rps)
            if n >= due:
                await asyncio.sleep(0.0005)
                continue
            body = b"[" + b",".join(b'{"op":"set","key":"k%d","value":{"x":%d}}' % (i + j, i + j)
                                    for j in range(per)) + b"]"
            i += per
            await api.bulk_bytes(body, durability=args.durability, columns=True)
            n += 1
            if counted >= 0:
                counted += 1
        wall = time.monotonic() - w0
        after = threads(srv.pid)
        await asyncio.sleep(0.3)
        delivered = got
        if spy is not None:
            spy.wait()
        names = python_thread_names(srv.pid)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await api.aclose()
        srv.kill()
        srv.wait()
        log.close()
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0, 0.0])
    for tid, (name, cpu, vol, invol, sys_cpu) in after.items():
        _n, cpu0, vol0, invol0, sys0 = before.get(tid, (name, 0.0, 0, 0, 0.0))
        row = by[_role(name, tid, srv.pid, names)]
        row[0] += cpu - cpu0
        row[1] += vol - vol0
        row[2] += invol - invol0
        row[3] += sys_cpu - sys0
    return {"requests": counted, "wall": wall, "per": per, "delivered": delivered, "threads": dict(by)}


def report(res: dict[str, Any], args: argparse.Namespace) -> None:
    n, wall, per = res["requests"], res["wall"], res["per"]
    print(f"{args.durability}, {args.consumers} consumer(s): {n} requests of {per} docs in {wall:.1f} s "
          f"({n / wall:.0f}/s); deliveries {res['delivered']} (of {n * per * args.consumers}); "
          f"load {os.getloadavg()[0]:.1f}")
    total = 0.0
    rows = sorted(res["threads"].items(), key=lambda kv: -kv[1][0])
    for name, (cpu, vol, invol, sys_cpu) in rows:
        total += cpu
        if cpu <= 0 and vol == 0:
            continue
        print(f"  {name:20s} {cpu / n * 1e6:7.0f} us/req (system {sys_cpu / n * 1e6:5.0f})  {cpu / wall * 100:5.1f} % core  "
              f"vol {vol / n:5.2f}/req  invol {invol / n:5.2f}/req")
    print(f"  {'total':20s} {total / n * 1e6:7.0f} us/req  {total / wall * 100:5.1f} % core  "
          f"{total / (n * per) * 1e6:6.0f} us/doc")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rps", type=int, default=250, help="write requests per second (paced)")
    ap.add_argument("--per", type=int, default=5, help="documents per request")
    ap.add_argument("--secs", type=float, default=10.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=1.0, help="load before the window starts")
    ap.add_argument("--durability", default="memory", choices=("memory", "persist"))
    ap.add_argument("--consumers", type=int, default=1)
    ap.add_argument("--runs", type=int, default=1, help="servers started one after the other")
    ap.add_argument("--root", default="", help="the tree whose server runs (default: this one)")
    ap.add_argument("--spy", default="", help="also write a py-spy raw profile of the window here")
    ap.add_argument("--server-args", default="", help="extra `upr server` flags")
    args = ap.parse_args(argv)
    for _ in range(args.runs):
        report(asyncio.run(run(args)), args)


if __name__ == "__main__":
    main()
