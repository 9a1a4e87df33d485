"""Replication lag for ``bench.bench_cluster``: from the active's ack to the replica holding the
write in memory, at a paced ``memory`` write rate.

Two nodes, one replica each way.  A paced writer (this process) sends ``memory`` bulk writes,
one bulk per node per tick, and records when each (partition, seqno) was acknowledged; a poller
process (``bench.cluster_poll``) reads both nodes' ``GET /partitions`` and notes when each
replica's high seqno covers it.  Both use the host's monotonic clock; the matching and its
resolution are ``bench.cluster_figures.replica_lags``'s.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import orjson
import psutil

from bench.bench_http import RawConnection
from bench.cluster_figures import Ack, Figure, Poll, replica_lags, summary_ms, verdict
from bench.cluster_procs import BenchCluster, partition_of
from bench.suite.procs import ProcessGroup
from tests.support.server import ROOT, server_env



class Pool:
    """Keep-alive connections to one node, one per request in flight."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.idle: list[RawConnection] = []

    async def request(self, method: str, target: str, body: bytes, ctype: str) -> tuple[int, bytes]:
        conn = self.idle.pop() if self.idle else await RawConnection.open(self.url)
        try:
            answer = await conn.request(method, target, body, ctype)
        except BaseException:
            conn.close()
            raise
        self.idle.append(conn)
        return answer

    def close(self) -> None:
        for conn in self.idle:
            conn.close()


class CpuWindow:
    """CPU seconds of some processes between two moments, sampled by whoever is awake then."""

    def __init__(self, procs: list[psutil.Process], start_at: float, stop_at: float) -> None:
        self.procs, self.start_at, self.stop_at = procs, start_at, stop_at
        self.first: list[float] | None = None
        self.last: list[float] | None = None

    def sample(self, now: float) -> None:
        if self.first is None and now >= self.start_at:
            self.first = self._cpu()
        elif self.last is None and now >= self.stop_at:
            self.last = self._cpu()

    def _cpu(self) -> list[float]:
        return [sum(p.cpu_times()[:2]) for p in self.procs]

    def used(self) -> list[float]:
        if self.first is None or self.last is None:
            return [float("nan")] * len(self.procs)
        return [(b - a) / (self.stop_at - self.start_at) for a, b in zip(self.first, self.last)]


async def paced_writer(actives: dict[int, str], partitions: int, rate: float, tick: float, start_at: float,
                       stop_at: float, cpu: CpuWindow, max_in_flight: int = 16) -> tuple[list[Ack], int, int]:
    """Bulk ``memory`` writes at ``rate`` items/s from now to ``stop_at``; the acks of writes sent
    from ``start_at`` on, the items sent in that window and the errors."""
    pools = {url: Pool(url) for url in set(actives.values())}
    per_tick = max(1, round(rate * tick))
    acks: list[Ack] = []
    counts = {"sent": 0, "errors": 0}
    in_flight = asyncio.Semaphore(max_in_flight * len(pools))
    tasks: set[asyncio.Task[None]] = set()
    target = "/docs/_bulk?durability=memory&results=columns"

    async def send(url: str, body: bytes, n: int, sent: float) -> None:
        try:
            status, answer = await pools[url].request("POST", target, body, "application/json")
            done = time.monotonic()
            measured = sent >= start_at
            if status != 200:
                counts["errors"] += n if measured else 0
                return
            cols = orjson.loads(answer)["columns"]
            if measured:
                acks.extend(Ack(p, s, done) for p, s, st in zip(cols["partition"], cols["seqno"], cols["status"])
                            if st == 200)
                counts["errors"] += sum(1 for st in cols["status"] if st != 200)
        finally:
            in_flight.release()

    t0 = time.monotonic()
    i = k = 0
    try:
        while True:
            due = t0 + k * tick
            now = time.monotonic()
            cpu.sample(now)
            if due >= stop_at:
                cpu.sample(max(now, stop_at))
                break
            if due > now:
                await asyncio.sleep(due - now)
            k += 1
            by_url: dict[str, list[dict[str, str]]] = {}
            for _ in range(per_tick):
                key = f"lag-{i}"
                i += 1
                by_url.setdefault(actives[partition_of(key, partitions)], []).append(
                    {"op": "set", "key": key, "value": "v" * 180})
            sent = time.monotonic()
            for url, ops in by_url.items():
                await in_flight.acquire()
                if sent >= start_at:
                    counts["sent"] += len(ops)
                task = asyncio.create_task(send(url, orjson.dumps(ops), len(ops), sent))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
    finally:
        for pool in pools.values():
            pool.close()
    return acks, counts["sent"], counts["errors"]


@dataclass
class LagResult:
    rate: float
    lags: list[float]
    unseen: int
    sent: int
    errors: int
    seconds: float
    period_ms: float
    polls: int
    #: CPU use of each node and of the poller over the window (1.0 = one core)
    node_cpu: list[float]
    poller_cpu: float


def measure_lag(group: ProcessGroup, cluster: BenchCluster, rate: float, args: argparse.Namespace) -> LagResult:
    actives = cluster.actives()
    urls = sorted({n.url for n in cluster.live()})
    start_at = time.monotonic() + 3.0  # the poller's start-up, then a second of warm-up writes
    stop_at = start_at + args.lag_seconds
    poller = group.spawn([sys.executable, "-m", "bench.cluster_poll", *urls, "--start-at", f"{start_at - 1:.6f}",
                          "--stop-at", f"{stop_at + 1:.6f}", "--interval-ms", str(args.lag_poll_ms)],
                         name="poller", cwd=ROOT, env=server_env(), stdout=subprocess.PIPE,
                         log=cluster.workdir / "poller.log")
    time.sleep(max(0.0, start_at - 1 - time.monotonic()))
    watched = [psutil.Process(n.proc.pid) for n in cluster.live() if n.proc is not None] + [psutil.Process(poller.pid)]
    cpu = CpuWindow(watched, start_at, stop_at)
    acks, sent, errors = asyncio.run(paced_writer(actives, args.partitions, rate, args.lag_tick_ms / 1000,
                                                  start_at, stop_at, cpu))
    out, _ = poller.communicate(timeout=60 + args.lag_seconds)
    group.stop(poller)
    if poller.returncode != 0:
        raise RuntimeError(f"the replica poller failed ({poller.returncode}); see {cluster.workdir / 'poller.log'}")
    polled = orjson.loads(out)
    replica_of = {e["partition"]: cluster.nodes[e["replicas"][0]["node"]].url
                  for e in cluster.view()["map"]["partitions"]}
    lags: list[float] = []
    unseen = 0
    for url in urls:
        polls = [Poll(s, r, {int(p): h for p, h in highs.items()}) for s, r, highs in polled[url]["polls"]]
        mine = [a for a in acks if replica_of[a.partition] == url]
        got, missing = replica_lags(mine, polls)
        lags += got
        unseen += missing
    periods = [polled[u]["period"] for u in urls if polled[u]["period"] is not None]
    used = cpu.used()
    return LagResult(rate, lags, unseen, sent, errors, args.lag_seconds,
                     statistics.median(periods) * 1000 if periods else float("nan"),
                     sum(polled[u]["count"] for u in urls), used[:-1], used[-1])


def lag_figure(res: LagResult, args: argparse.Namespace, baseline: bool = False) -> Figure:
    """The goal's row (``baseline`` False), or the same method at a low rate: what the machine's
    scheduling alone costs, so that a missed goal can be told apart from a rate the replicas
    cannot follow."""
    name = f"replication lag at {res.rate:,.0f}/s" + (" (baseline)" if baseline else "")
    goal = "—" if baseline else "p99 ≤ 20 ms"
    if not res.lags:
        return Figure(name, "no write was seen on a replica", goal, "NOT met")
    s = summary_ms(res.lags)
    result = (f"p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms, max {s['p100']:.1f} ms "
              f"({len(res.lags):,} writes seen, {res.sent / res.seconds:,.0f}/s sent"
              + (f"; {res.unseen} never seen, {res.errors} errors" if res.unseen or res.errors else "") + ")")
    method = (f"paced memory bulk writes, {res.rate:,.0f}/s offered in bulks every {args.lag_tick_ms:g} ms per "
              f"node, 2 nodes x 1 replica, {args.partitions} partitions, {args.lag_seconds:g} s; ack time at the "
              f"writer vs the midpoint of the first GET /partitions poll of the replica's node whose high seqno "
              f"covers it (same-host monotonic clock); resolution: one poll period, median {res.period_ms:.1f} ms "
              f"({res.polls:,} polls); CPU (1 core = 100%) nodes {'+'.join(f'{c:.0%}' for c in res.node_cpu)}, "
              f"poller {res.poller_cpu:.0%}")
    return Figure(name, result, goal, "—" if baseline else verdict(s["p99"], 20.0, False), method)
