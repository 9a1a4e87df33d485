"""What open consoles cost the node: server CPU per second with 0 and N browser tabs on ``/ui/``,
idle and under an ingest + tail load (docs/benchmarks.md, "Console").

    python -m bench.bench_console [--partitions 1024] [--browsers 5] [--seconds 15] [--rounds 2]

A real ``upr server`` process; the browsers are Debian's chromium driven by Playwright
(``tests.ui.browser``), one context per tab, each polling the overview once a second and holding
an event long poll, as a person's tab does.  The server's CPU is read from /proc (psutil) for its
process only, so the browsers' own CPU is not counted in it; it is shown apart (``browser_cpu_pct``:
Playwright's driver and chromium), since on a small machine the browsers compete with the node.  Under load a writer posts bulk batches as
fast as the node takes them and a consumer tails every partition; phases alternate (0, N, 0, N)
so drift on a shared machine affects both sides alike.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.server import start_upr_server
from tests.support.wsclient import RawStream
from tests.ui.browser import ensure_chromium


class Load:
    """A bulk writer and a tailing consumer, counting what they move."""

    def __init__(self, url: str, partitions: int) -> None:
        self.url, self.partitions = url, partitions
        self.written = 0
        self.received = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _write(self) -> None:
        n = 0
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                batch = [{"op": "set", "key": f"k{n}-{i}", "value": {"n": n, "i": i}} for i in range(500)]
                n += 1
                if client.post("/docs/_bulk", json=batch).status_code == 200:
                    self.written += len(batch)

    def _tail(self) -> None:
        async def run() -> None:
            stream = await RawStream.open(self.url, name="bench-tail", codec="binary")
            await stream.stream(range(self.partitions))
            while not self._stop.is_set():
                try:
                    msg = await stream.recv(timeout=1.0)
                except TimeoutError:
                    continue
                seqnos = getattr(msg, "seqnos", None)
                if seqnos is not None:
                    self.received += len(seqnos)
            await stream.close()

        asyncio.run(run())

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._write), threading.Thread(target=self._tail)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _browser_cpu(server: psutil.Process) -> float:
    """CPU of this process's other descendants: Playwright's driver and the chromium processes."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        if child.pid == server.pid:
            continue
        try:
            total += _cpu(child)
        except psutil.Error:
            pass
    return total


def phase(proc: psutil.Process, seconds: float, load: Load | None) -> dict[str, float]:
    written0, received0 = (load.written, load.received) if load else (0, 0)
    cpu0, browsers0, t0 = _cpu(proc), _browser_cpu(proc), time.monotonic()
    time.sleep(seconds)
    cpu1, browsers1, t1 = _cpu(proc), _browser_cpu(proc), time.monotonic()
    out = {"cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0), "browser_cpu_pct": 100 * (browsers1 - browsers0) / (t1 - t0)}
    if load:
        out["ingest_per_s"] = (load.written - written0) / (t1 - t0)
        out["tail_per_s"] = (load.received - received0) / (t1 - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="server CPU spent on open consoles")
    parser.add_argument("--partitions", type=int, default=1024)
    parser.add_argument("--browsers", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = ensure_chromium()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_upr_server(Path(tmp), partitions=args.partitions)
        server = psutil.Process(proc.pid)
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium)
                contexts: list[Any] = []

                def tabs(n: int) -> None:
                    while len(contexts) > n:
                        contexts.pop().close()
                    while len(contexts) < n:
                        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
                        page = ctx.new_page()
                        page.goto(url + "/ui/")
                        page.wait_for_selector("#map .cell")
                        contexts.append(ctx)
                    time.sleep(2.0)  # settle: pages loaded, polls in their steady rhythm

                for mode in ("idle", "load"):
                    load = Load(url, args.partitions) if mode == "load" else None
                    if load:
                        load.start()
                        time.sleep(3.0)  # the tail caught up with the backlog
                    for _round in range(args.rounds):
                        for n in (0, args.browsers):
                            tabs(n)
                            figures = phase(server, args.seconds, load)
                            results.setdefault((mode, n), []).append(figures)
                            print(f"{mode:4} browsers={n} " + " ".join(f"{k}={v:,.1f}" for k, v in figures.items()),
                                  flush=True)
                    tabs(0)
                    if load:
                        load.stop()
                browser.close()
        finally:
            proc.kill()
            proc.wait(timeout=10)
    print(f"\nmedian of {args.rounds} x {args.seconds:.0f} s, {args.partitions} partitions, server process CPU only")
    for (mode, n), rows in sorted(results.items()):
        keys = rows[0].keys()
        print(f"{mode:4} browsers={n}: " + ", ".join(f"{k} {statistics.median(r[k] for r in rows):,.1f}" for k in keys))
    for mode in ("idle", "load"):
        base = statistics.median(r["cpu_pct"] for r in results[(mode, 0)])
        with_tabs = statistics.median(r["cpu_pct"] for r in results[(mode, args.browsers)])
        print(f"{mode}: {args.browsers} consoles cost {with_tabs - base:+.2f} % of a core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
