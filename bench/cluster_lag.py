"""Replication lag for ``bench.bench_cluster``: from the active's ack to the replica holding the
write in memory, at a paced ``memory`` write rate.

Two nodes, one replica each way.  A paced writer (this process) sends ``memory`` bulk writes,
one bulk per node per tick, and records when each (partition, seqno) was acknowledged; an observer
process (``bench.cluster_poll``) tails both nodes' replica partitions (or, ``--lag-observe poll``,
polls their ``GET /partitions``) and notes when each replica's high seqno covers it.  Both use the host's monotonic clock; the matching and its
resolution are ``bench.cluster_figures.replica_lags``'s.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import psutil

from app.cluster.lag_trace import TRACE_ENV
from bench.bench_http import RawConnection
from bench.cluster_figures import STAGES, Ack, Figure, Poll, replica_lags, stage_lags, summary_ms, verdict
from bench.cluster_procs import BenchCluster, partition_of, release_together
from bench.suite.procs import ProcessGroup
from tests.support.server import ROOT, server_env



class Pool:
    """Keep-alive connections to one node, one per request in flight."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.idle: list[RawConnection] = []

    async def request(self, method: str, target: str, body: bytes, ctype: str) -> tuple[int, bytes]:
        reused = bool(self.idle)
        conn = self.idle.pop() if reused else await RawConnection.open(self.url)
        try:
            answer = await conn.request(method, target, body, ctype)
        except (asyncio.IncompleteReadError, ConnectionError):
            conn.close()
            if not reused:
                raise
            # the server closes a keep-alive connection left idle too long: once more on a new one
            conn = await RawConnection.open(self.url)
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
                       stop_at: float, cpu: CpuWindow, max_in_flight: int = 16,
                       bulks: dict[str, int] | None = None,
                       writes: dict[str, int] | None = None) -> tuple[list[Ack], int, int]:
    """Bulk ``memory`` writes at ``rate`` items/s from now to ``stop_at``; the acks of writes sent
    from ``start_at`` on, the items sent in that window and the errors.  ``bulks``, if given,
    counts the bulk requests sent in the window per node URL, ``writes`` their items."""
    pools = {url: Pool(url) for url in set(actives.values())}
    per_tick = max(1, round(rate * tick))
    acks: list[Ack] = []
    counts = {"sent": 0, "errors": 0}
    in_flight = asyncio.Semaphore(max_in_flight * len(pools))
    tasks: set[asyncio.Task[None]] = set()
    target = "/docs/_bulk?durability=memory&results=columns"

    async def send(url: str, body: bytes, n: int, sent: float) -> None:
        measured = sent >= start_at
        try:
            try:
                status, answer = await pools[url].request("POST", target, body, "application/json")
            except (OSError, asyncio.IncompleteReadError):
                counts["errors"] += n if measured else 0
                return
            done = time.monotonic()
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
                    if bulks is not None:
                        bulks[url] = bulks.get(url, 0) + 1
                    if writes is not None:
                        writes[url] = writes.get(url, 0) + len(ops)
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
    #: how the replicas were observed: "stream" (tailed) or "poll" (GET /partitions)
    observe: str = "stream"
    #: ``--lag-stages``: seconds per stage (``bench.cluster_figures.STAGES``) and acks without a stamp
    stages: dict[str, list[float]] | None = None
    unstaged: int = 0
    #: the slowest observed node's time from its hello to its last stream answer (all before the window)
    opened_s: float | None = None


def measure_lag(group: ProcessGroup, cluster: BenchCluster, rate: float, args: argparse.Namespace) -> LagResult:
    """Paced writes for ``args.lag_seconds`` after a second of warm-up, then as long as the
    replicas need to hold every acknowledged write (at most ``args.lag_drain``): a write no poll
    showed by then counts as an infinite lag, so a replica that falls behind shows in the tail
    instead of being left out."""
    cluster.wait_until(cluster.placed_and_followed, 300, "every replica in sync before measuring the lag")
    actives = cluster.actives()
    urls = sorted({n.url for n in cluster.live()})
    trace = cluster.env.get(TRACE_ENV)
    staged = trace is not None and args.lag_observe == "stream"
    poller = group.spawn([sys.executable, "-m", "bench.cluster_poll", *urls, "--interval-ms", str(args.lag_poll_ms),
                          "--max-seconds", str(args.lag_drain + 5), "--observe", args.lag_observe,
                          *(["--actives"] if staged else [])],
                         name="poller", cwd=ROOT, env=server_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         log=cluster.workdir / "poller.log")
    watched = [psutil.Process(n.proc.pid) for n in cluster.live() if n.proc is not None] + [psutil.Process(poller.pid)]
    start_at, stop_at = release_together([poller], 1.0, args.lag_seconds)
    cpu = CpuWindow(watched, start_at, stop_at)
    acks, sent, errors = asyncio.run(paced_writer(actives, args.partitions, rate, args.lag_tick_ms / 1000,
                                                  start_at, stop_at, cpu))
    replica_of = {e["partition"]: cluster.nodes[e["replicas"][0]["node"]].url
                  for e in cluster.view()["map"]["partitions"]}
    wait_until_held(replica_of, acks, time.monotonic() + args.lag_drain)
    assert poller.stdin is not None
    # the observer goes on until it has seen what the replicas hold (bench.cluster_poll.Stop)
    poller.stdin.write(b"stop " + orjson.dumps(acked_highs(replica_of, acks), option=orjson.OPT_NON_STR_KEYS) + b"\n")
    poller.stdin.flush()
    out, _ = poller.communicate(timeout=60)
    group.stop(poller)
    if poller.returncode != 0:
        raise RuntimeError(f"the replica poller failed ({poller.returncode}); see {cluster.workdir / 'poller.log'}")
    polled = orjson.loads(out)
    # the raw records beside the nodes' logs: an outlier can then be traced write by write
    (cluster.workdir / f"lag-{rate:g}-{time.time():.0f}.json").write_bytes(orjson.dumps(
        {"acks": [(a.partition, a.seqno, a.t) for a in acks], "replica_of": replica_of, "polled": polled},
        option=orjson.OPT_NON_STR_KEYS))
    lags: list[float] = []
    unseen = 0
    for url in urls:
        polls = [Poll(s, r, {int(p): h for p, h in highs.items()}) for s, r, highs in polled[url]["polls"]]
        mine = [a for a in acks if replica_of[a.partition] == url]
        got, missing = replica_lags(mine, polls)
        lags += got + [math.inf] * missing
        unseen += missing
    periods = [polled[u]["period"] for u in urls if polled[u]["period"] is not None]
    used = cpu.used()
    result = LagResult(rate, lags, unseen, sent, errors, args.lag_seconds,
                       statistics.median(periods) * 1000 if periods else float("nan"),
                       sum(polled[u]["count"] for u in urls), used[:-1], used[-1], args.lag_observe)
    opened = [polled[u]["opened_s"] for u in urls if polled[u].get("opened_s") is not None]
    result.opened_s = max(opened) if opened else None
    if staged:
        assert trace is not None
        with open(trace, "rb") as f:
            records = [orjson.loads(line) for line in f if line.strip()]

        def polls_of(key: str) -> list[Poll]:
            return [Poll(s, r, {int(p): h for p, h in highs.items()}) for s, r, highs in polled[key]["polls"]]

        active_polls = [poll for u in urls for poll in polls_of(f"active {u}")]
        active_polls.sort(key=lambda poll: poll.received)
        replica_polls = sorted((poll for u in urls for poll in polls_of(u)), key=lambda poll: poll.received)
        result.stages, result.unstaged = stage_lags(acks, records, active_polls, replica_polls)
    return result


#: set in the bench's environment: the nodes' replication frames (``UPR_REPLICATION_FRAMES``:
#: ``messages`` or ``packed``), for before/after runs on one tree
FRAMES_BENCH_ENV = "BENCH_REPLICATION_FRAMES"


def stage_env(args: argparse.Namespace, workdir: Path) -> dict[str, str]:
    """The nodes' environment for ``--lag-stages`` (each replica stamps what it receives and
    applies) and for ``BENCH_REPLICATION_FRAMES``."""
    env = {TRACE_ENV: str(workdir / "replication-trace.jsonl")} if getattr(args, "lag_stages", False) else {}
    frames = os.environ.get(FRAMES_BENCH_ENV)
    if frames:
        env["UPR_REPLICATION_FRAMES"] = frames
    return env


def acked_highs(replica_of: dict[int, str], acks: list[Ack]) -> dict[str, dict[int, int]]:
    """Per replica node URL, the highest acknowledged seqno of each partition it replicates."""
    out: dict[str, dict[int, int]] = {}
    for ack in acks:
        mine = out.setdefault(replica_of[ack.partition], {})
        mine[ack.partition] = max(mine.get(ack.partition, 0), ack.seqno)
    return out


def wait_until_held(replica_of: dict[int, str], acks: list[Ack], deadline: float) -> bool:
    """Poll (slowly: the poller process is measuring) until each partition's replica holds the
    highest acknowledged seqno, or ``deadline``; whether they all did."""
    wanted: dict[int, int] = {}
    for ack in acks:
        wanted[ack.partition] = max(wanted.get(ack.partition, 0), ack.seqno)
    while time.monotonic() < deadline:
        held = True
        for url in set(replica_of.values()):
            highs = {p["partition"]: p["high_seqno"]
                     for p in httpx.get(f"{url}/partitions", timeout=10).json()["partitions"]}
            held = held and all(highs[p] >= s for p, s in wanted.items() if replica_of[p] == url)
        if held:
            return True
        time.sleep(0.25)
    return False


def cpu_per_write_us(res: LagResult) -> float:
    """Both nodes' CPU time per write sent in the window, in µs (nan without a CPU reading)."""
    if not res.sent:
        return float("nan")
    return sum(res.node_cpu) * res.seconds / res.sent * 1e6


def lag_figure(res: LagResult, args: argparse.Namespace, baseline: bool = False) -> Figure:
    """The goal's row (``baseline`` False), or the same method at a low rate: what the machine's
    scheduling alone costs, so that a missed goal can be told apart from a rate the replicas
    cannot follow."""
    name = f"replication lag at {res.rate:,.0f}/s" + (" (baseline)" if baseline else "")
    goal = "—" if baseline else "p99 ≤ 20 ms"
    if not res.lags:
        return Figure(name, "no write was seen on a replica", goal, "NOT met")
    s = summary_ms(res.lags)

    def ms(value: float) -> str:
        return f"{value:.1f} ms" if math.isfinite(value) else f"> {args.lag_drain:g} s"

    result = (f"p50 {ms(s['p50'])}, p99 {ms(s['p99'])}, max {ms(s['p100'])} "
              f"({len(res.lags):,} writes, {res.sent / res.seconds:,.0f}/s sent"
              + (f"; {res.unseen} not on their replica {args.lag_drain:g} s after the writes ended"
                 if res.unseen else "") + (f"; {res.errors} errors" if res.errors else "") + ")")
    method = (f"paced memory bulk writes, {res.rate:,.0f}/s offered in bulks every {args.lag_tick_ms:g} ms per "
              f"node, 2 nodes x 1 replica, {args.partitions} partitions, {args.lag_seconds:g} s from in-sync "
              f"replicas; ack time at the writer vs "
              + (f"the arrival of the first message that carries it on a tail of the replica node's replica "
                 f"partitions (a stream with expected_state replica, pushed by the node as its copy takes each "
                 f"batch; {res.polls:,} messages, median {res.period_ms:.1f} ms apart"
                 + (f"; every stream open before the window, the last {res.opened_s * 1000:.0f} ms after its hello"
                    if res.opened_s is not None else "") + ")"
                 if res.observe == "stream" else
                 f"the midpoint of the first GET /partitions poll of the replica's node whose high seqno covers it; "
                 f"resolution: one poll period, median {res.period_ms:.1f} ms ({res.polls:,} polls)")
              + f" (same-host monotonic clock); CPU (1 core = 100%) nodes "
              f"{'+'.join(f'{c:.0%}' for c in res.node_cpu)}, observer {res.poller_cpu:.0%}; both nodes' CPU per "
              f"write {cpu_per_write_us(res):.0f} µs (each write is taken over HTTP by its active, streamed and "
              f"applied on its replica, observed: what the two cores can carry is about 2 s / that)")
    if res.stages is not None:
        parts = []
        for stage in STAGES:
            values = res.stages.get(stage, [])
            if values:
                q = summary_ms(values, (50, 99))
                parts.append(f"{stage} {q['p50']:.1f} / {q['p99']:.1f} ms")
        method += ("; per stage, p50 / p99 (--lag-stages: the replicas' stamps, a tail of the actives as the "
                   f"replication sender's proxy; {res.unstaged:,} writes without every stamp): " + ", ".join(parts))
    return Figure(name, result, goal, "—" if baseline else verdict(s["p99"], 20.0, False), method)
