"""HTTP write throughput of ``upr server``, beside trivial endpoints measured in the same run.

    .venv/bin/python -m bench.bench_http               # 3 rounds x 7 phases x 2.5 s, ~1.5 minutes
    .venv/bin/python -m bench.bench_http --full        # 5 rounds x 10 s phases
    .venv/bin/python -m bench.bench_http --breakdown   # + bulk path CPU per stage, in process

Phases (each ``--seconds`` long after a short warm-up, same client, same concurrency), run in
``--rounds`` rounds; medians are printed, and each ratio is taken within its own round:

* ``fastapi trivial POST``: a bare FastAPI app (one ``POST`` returning a constant), under the
  same uvicorn settings as upr (uvloop, httptools, no access log): the framework's ceiling.
* ``upr GET /health``: upr's cheapest endpoint, through its middleware.
* ``upr PUT /docs/{key}`` (memory, and persist): single-document writes, 200-byte values.
* ``upr POST /docs/_bulk`` durability=persist, 1000-item batches, JSON-object values and
  base64 values, per-item results as columns (``results=columns``): mutations/s; and base64
  values once more with the default per-item result objects.

Client (``--client``): ``raw`` (default) is a minimal asyncio HTTP/1.1 keep-alive client,
one connection per in-flight request; ``httpx`` is ``httpx.AsyncClient``.  WHY raw by
default: on this machine httpx itself tops out far below the server, and lower at
concurrency 32 than at 1 (docs/benchmarks.md, HTTP: "Why not httpx"), so an httpx run
measures httpx.  ``--concurrency`` requests are in
flight (``--bulk-concurrency`` for bulk).  Everything runs on one machine, so the client
competes with the server for the 2 cores: compare ratios from one run.  The server's CPU
use per phase (and per request) tells a saturated server from a client-bound run.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from bench.server import start_upr_server
from bench.suite.ports import free_port

import httpx
import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]

TRIVIAL_APP = """
import sys, uvicorn
from fastapi import FastAPI
app = FastAPI()
@app.post("/t")
async def t():
    return {"ok": True}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
            loop="uvloop", http="httptools")
"""


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not ready")


def start_upr(data_dir: Path, partitions: int) -> tuple[subprocess.Popen[bytes], str]:
    return start_upr_server(data_dir.parent, name="upr", data_dir=data_dir, partitions=partitions)


class RawConnection:
    """One keep-alive HTTP/1.1 connection: send a request, read status and body (Content-Length)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    async def request(self, method: str, target: str, body: bytes = b"", ctype: str = "") -> tuple[int, bytes]:
        head = f"{method} {target} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n"
        if ctype:
            head += f"Content-Type: {ctype}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        length = 0
        for line in raw.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


class Client:
    """The same calls over either transport; ``session()`` gives one worker its connection."""

    def __init__(self, kind: str, concurrency: int) -> None:
        self.kind = kind
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.httpx = httpx.AsyncClient(limits=limits, timeout=60) if kind == "httpx" else None

    async def session(self, base: str) -> Callable[..., Awaitable[tuple[int, bytes]]]:
        if self.httpx is not None:
            client = self.httpx

            async def via_httpx(method: str, target: str, body: bytes = b"", ctype: str = "") -> tuple[int, bytes]:
                headers = {"content-type": ctype} if ctype else None
                r = await client.request(method, base + target, content=body, headers=headers)
                return r.status_code, r.content
            return via_httpx
        conn = await RawConnection.open(base)
        return conn.request

    async def aclose(self) -> None:
        if self.httpx is not None:
            await self.httpx.aclose()


@dataclass
class Result:
    name: str
    requests: int
    units: int
    seconds: float
    server_cpu: float
    errors: int
    #: CPU seconds of the server's event-loop thread and of its engine flusher over the phase
    split: dict[str, float] | None = None

    @property
    def req_rate(self) -> float:
        return self.requests / self.seconds

    @property
    def unit_rate(self) -> float:
        return self.units / self.seconds


async def run_phase(
    name: str,
    client: Client,
    base: str,
    make: Callable[[Callable[..., Awaitable[tuple[int, bytes]]], int], Awaitable[tuple[int, bool]]],
    concurrency: int,
    seconds: float,
    server: psutil.Process,
    warmup: float = 0.5,
    split: Callable[[], dict[str, float]] | None = None,
) -> Result:
    """``make(send, i)`` sends request ``i`` and returns (units done, ok).  Counts only after warm-up."""
    counter = iter(range(1 << 62))
    state = {"measuring": False, "requests": 0, "units": 0, "errors": 0}
    stop_at = time.monotonic() + warmup + seconds

    sessions = [await client.session(base) for _ in range(concurrency)]

    async def worker(send: Callable[..., Awaitable[tuple[int, bytes]]]) -> None:
        while time.monotonic() < stop_at:
            units, ok = await make(send, next(counter))
            if state["measuring"]:
                state["requests"] += 1
                state["units"] += units if ok else 0
                state["errors"] += 0 if ok else 1

    tasks = [asyncio.create_task(worker(send)) for send in sessions]
    await asyncio.sleep(warmup)
    split0 = split() if split else None
    cpu0 = sum(server.cpu_times()[:2])
    t0 = time.monotonic()
    state["measuring"] = True
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - t0
    cpu = (sum(server.cpu_times()[:2]) - cpu0) / elapsed
    spent = None
    if split and split0 is not None:
        split1 = split()
        spent = {k: split1[k] - split0[k] for k in split1}
    return Result(name, state["requests"], state["units"], elapsed, cpu, state["errors"], spent)


def server_split(proc: psutil.Process, url: str) -> Callable[[], dict[str, float]]:
    """CPU seconds so far of the server's main thread (the event loop) and of the engine's flusher
    (its own counter, ``upr_engine_flush_cpu_seconds_total`` in /metrics); the rest of the server's
    CPU is the writer thread's (and a little of the reader threads')."""

    def sample() -> dict[str, float]:
        loop = next((t.user_time + t.system_time for t in proc.threads() if t.id == proc.pid), 0.0)
        flush = rounds = 0.0
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("upr_engine_flush_cpu_seconds_total "):
                flush = float(line.split()[1])
            elif line.startswith("upr_engine_flush_count_total "):
                rounds = float(line.split()[1])
        return {"loop": loop, "flush": flush, "rounds": rounds, "all": sum(proc.cpu_times()[:2])}

    return sample


def bulk_bodies(count: int, batch: int, binary: bool, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    bodies = []
    for b in range(count):
        items = []
        for i in range(batch):
            key = f"bulk-{seed}-{b}-{i}"
            if binary:
                items.append({"op": "set", "key": key, "value_b64": base64.b64encode(rnd.randbytes(75)).decode()})
            else:
                items.append({"op": "set", "key": key,
                              "value": {"id": i, "name": f"user {b}-{i}", "score": rnd.random(), "tags": ["a", "b"]}})
        bodies.append(orjson.dumps(items))
    return bodies


async def main_async(args: argparse.Namespace) -> list[list[Result]]:
    work = Path(tempfile.mkdtemp(prefix="upr-bench-http-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        port = free_port()
        trivial = subprocess.Popen([sys.executable, "-c", TRIVIAL_APP, str(port)], cwd=ROOT)
        procs.append(trivial)
        trivial_url = f"http://127.0.0.1:{port}"
        wait_ready(f"{trivial_url}/docs", trivial)
        upr, url = start_upr(work / "data", args.partitions)
        procs.append(upr)
        results: list[list[Result]] = []
        value = b"v" * 200
        client = Client(args.client, max(args.concurrency, args.bulk_concurrency))
        Send = Callable[..., Awaitable[tuple[int, bytes]]]

        async def trivial_post(send: Send, i: int) -> tuple[int, bool]:
            status, _ = await send("POST", "/t", b"{}", "application/json")
            return 1, status == 200

        async def health(send: Send, i: int) -> tuple[int, bool]:
            status, _ = await send("GET", "/health")
            return 1, status == 200

        def put(durability: str) -> Callable[[Send, int], Awaitable[tuple[int, bool]]]:
            async def call(send: Send, i: int) -> tuple[int, bool]:
                status, _ = await send("PUT", f"/docs/doc-{i % 100_000}?durability={durability}", value)
                return 1, status == 200
            return call

        def bulk(bodies: list[bytes], results: str = "columns") -> Callable[[Send, int], Awaitable[tuple[int, bool]]]:
            async def call(send: Send, i: int) -> tuple[int, bool]:
                status, body = await send("POST", f"/docs/_bulk?durability=persist&results={results}",
                                          bodies[i % len(bodies)], "application/json")
                ok = status == 200
                return (orjson.loads(body)["succeeded"] if ok else 0), ok
            return call

        try:
            fp = psutil.Process(trivial.pid)
            up = psutil.Process(upr.pid)
            split = server_split(up, url)
            c, s, bc = args.concurrency, args.seconds, args.bulk_concurrency
            for rnd in range(args.rounds):  # rounds, so that ratios come from phases run close together
                json_bodies = bulk_bodies(args.bodies, args.batch, binary=False, seed=10 * rnd + 1)
                b64_bodies = bulk_bodies(args.bodies, args.batch, binary=True, seed=10 * rnd + 2)
                results.append([
                    await run_phase("fastapi trivial POST", client, trivial_url, trivial_post, c, s, fp),
                    await run_phase("upr GET /health", client, url, health, c, s, up),
                    await run_phase("upr PUT /docs/{key} memory", client, url, put("memory"), c, s, up),
                    await run_phase("upr PUT /docs/{key} persist", client, url, put("persist"), c, s, up),
                    await run_phase(f"upr bulk {args.batch} persist, JSON values", client, url,
                                    bulk(json_bodies), bc, s, up, split=split),
                    await run_phase(f"upr bulk {args.batch} persist, value_b64", client, url,
                                    bulk(b64_bodies), bc, s, up, split=split),
                    await run_phase(f"upr bulk {args.batch} persist, value_b64, results=objects", client, url,
                                    bulk(b64_bodies, "objects"), bc, s, up, split=split),
                ])
        finally:
            await client.aclose()
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def report(rounds: list[list[Result]], args: argparse.Namespace) -> str:
    """Medians over rounds; each phase's ratio is taken against the trivial POST of its own round."""
    lines = [
        f"client: {args.client}, concurrency {args.concurrency} (bulk: {args.bulk_concurrency}), "
        f"{args.rounds} rounds x {args.seconds:g} s per phase, {args.partitions} partitions, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end",
        "",
        "| phase | requests/s | mutations/s | vs trivial POST (per round) | server CPU | server CPU µs/request | errors |",
        "|---|---|---|---|---|---|---|",
    ]

    def cpu_per_request(r: Result) -> float:
        return r.server_cpu * r.seconds / max(r.requests, 1)

    def cpu_per_unit(r: Result) -> float:
        return r.server_cpu * r.seconds / max(r.units, 1)

    names = [r.name for r in rounds[0]]
    for i, name in enumerate(names):
        runs = [rnd[i] for rnd in rounds]
        ratios = [rnd[i].req_rate / rnd[0].req_rate for rnd in rounds]
        muts = f"{_median([r.unit_rate for r in runs]):,.0f}" if "PUT" in name or "bulk" in name else "-"
        lines.append(
            f"| {name} | {_median([r.req_rate for r in runs]):,.0f} | {muts} | "
            f"{_median(ratios):.0%} ({', '.join(f'{x:.0%}' for x in ratios)}) | "
            f"{_median([r.server_cpu for r in runs]):.0%} | {_median([cpu_per_request(r) for r in runs]) * 1e6:,.0f} | "
            f"{sum(r.errors for r in runs)} |"
        )
    put_i = next(i for i, n in enumerate(names) if n.endswith("memory"))
    bulk_is = [i for i, n in enumerate(names) if "bulk" in n]
    put_ratio = _median([rnd[put_i].req_rate / rnd[0].req_rate for rnd in rounds])
    put_cpu_ratio = _median([cpu_per_request(rnd[0]) / cpu_per_request(rnd[put_i]) for rnd in rounds])
    best_bulk = max(_median([rnd[i].unit_rate for rnd in rounds]) for i in bulk_is)
    per_mutation = min(_median([cpu_per_unit(rnd[i]) for rnd in rounds]) for i in bulk_is)
    lines += ["", "| bulk phase | server CPU µs/mutation | event loop thread | flusher | writer + others |"
              " items per flush round |", "|---|---|---|---|---|---|"]
    for i in bulk_is:
        runs = [rnd[i] for rnd in rounds if rnd[i].split and rnd[i].units]
        if not runs:
            continue

        def per(key: str, runs: list[Result] = runs) -> float:
            return _median([r.split[key] / r.units * 1e6 for r in runs])  # type: ignore[index]

        rest = _median([(r.split["all"] - r.split["loop"] - r.split["flush"]) / r.units * 1e6  # type: ignore[index]
                        for r in runs])
        per_round = _median([r.units / r.split["rounds"] for r in runs if r.split["rounds"]] or [0.0])  # type: ignore[index]
        lines.append(f"| {names[i]} | {per('all'):.2f} | {per('loop'):.2f} | {per('flush'):.2f} | {rest:.2f} |"
                     f" {per_round:,.0f} |")
    lines += ["",
              f"single PUT (memory) / trivial POST: {put_ratio:.0%} by rate, {put_cpu_ratio:.0%} by server CPU "
              "per request (medians; goal >= 60%)",
              f"bulk persist best median: {best_bulk:,.0f} mutations/s (goal >= 150,000); server CPU per "
              f"mutation {per_mutation * 1e6:.1f} µs, i.e. at most {1 / per_mutation:,.0f}/s on one fully used core"]
    return "\n".join(lines)


def breakdown(batches: int = 10, reps: int = 4) -> str:
    """Per-mutation CPU of the bulk path's stages in this process (no HTTP, no flusher wait):
    where the server's time goes, measured with ``time.thread_time``, best of ``reps``."""
    from app import bulk
    from engine.config import EngineConfig
    from engine.engine import Engine

    work = Path(tempfile.mkdtemp(prefix="upr-bench-http-bd-"))
    engine = Engine.open(EngineConfig(data_dir=work / "data", partitions=64))
    lines = ["| values | parse (bulk.decode) | items -> WriteOp + result columns | engine.write_batch | orjson.dumps |"
             " total |", "|---|---|---|---|---|---|"]
    spent: dict[str, float] = {}

    class Timed:
        """The engine, with ``write_batch``'s own thread time kept apart from ``bulk.apply``'s."""

        def write_batch(self, ops):  # type: ignore[no-untyped-def]
            t = time.thread_time()
            try:
                return engine.write_batch(ops)
            finally:
                spent["write"] += time.thread_time() - t

    timed = Timed()
    try:
        for warm_up in (True, False):  # a first pass warms the allocator and is not reported
            for binary in (False, True):
                best: dict[str, float] = {}
                for rep in range(reps):
                    bodies = bulk_bodies(batches, 1000, binary, seed=100 + rep + 10 * warm_up)
                    spent.update(dict.fromkeys(("parse", "apply", "write", "dumps"), 0.0))
                    for body in bodies:
                        with bulk.gc_paused():  # as the server does around one request
                            t = time.thread_time()
                            items = bulk.decode(body, False, 10_000)
                            spent["parse"] += time.thread_time() - t
                            t = time.thread_time()
                            out, _targets = bulk.apply(timed, items, "persist", columns=True)
                            spent["apply"] += time.thread_time() - t
                            t = time.thread_time()
                            orjson.dumps(out)
                            spent["dumps"] += time.thread_time() - t
                    spent["apply"] -= spent["write"]
                    for k, v in spent.items():
                        best[k] = min(best.get(k, 1e9), v / (batches * 1000) * 1e6)
                if warm_up:
                    continue
                cells = " | ".join(f"{best[k]:.2f} µs" for k in ("parse", "apply", "write", "dumps"))
                lines.append(f"| {'value_b64' if binary else 'JSON objects'} | {cells} | {sum(best.values()):.2f} µs |")
    finally:
        engine.close()
        shutil.rmtree(work, ignore_errors=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=2.5, help="measured seconds per phase")
    p.add_argument("--rounds", type=int, default=3, help="rounds of all phases (medians are reported)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight (single-request phases)")
    p.add_argument("--bulk-concurrency", type=int, default=8, help="bulk requests in flight")
    p.add_argument("--batch", type=int, default=1000, help="items per bulk request")
    p.add_argument("--bodies", type=int, default=40, help="distinct bulk bodies to cycle through")
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--client", choices=["raw", "httpx"], default="raw", help="see the module docstring")
    p.add_argument("--full", action="store_true", help="5 rounds of 10 s phases")
    p.add_argument("--breakdown", action="store_true",
                   help="also print the bulk path's per-stage CPU per mutation (in process, no HTTP)")
    args = p.parse_args(argv)
    if args.full:
        args.seconds, args.rounds = 10.0, 5
    results = asyncio.run(main_async(args))
    print(report(results, args))
    if args.breakdown:
        print()
        print(breakdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
