"""The cluster's performance (issue 14): failover time, replication lag, majority write cost and
aggregate ingest, measured in one run on real etcd and real ``upr server --cluster`` processes.

    .venv/bin/python -m bench.bench_cluster              # 10 failover rounds, ~5 minutes
    .venv/bin/python -m bench.bench_cluster --quick      # tiny settings, for trying the harness
    .venv/bin/python -m bench.bench_cluster --rounds 20 --lag-seconds 30

What each figure measures (every process on one host, so one monotonic clock):

1. **Failover time**: three nodes, one replica per partition, lease TTL ``--lease-ttl`` (2 s).
   Once every replica is in sync, after a random pause (so the kill falls anywhere in the
   lease's keep-alive cycle), the node active for the most partitions is SIGKILLed.  For each of
   its partitions a probe writes (``PUT``) to the node the newest map names (the map is read
   from every survivor's ``GET /cluster`` every ``--map-poll-ms``; a 421 is followed at once)
   until a write is accepted: time from the signal to that answer.  The node is restarted on
   its data dir and the next round waits until it rejoined and every replica is in sync again.
2. **Replication lag**: two nodes, one replica each way.  A paced writer sends ``memory`` bulk
   writes at ``--lag-rate`` items/s (one bulk per node per ``--lag-tick-ms``) and records when
   each (partition, seqno) was acknowledged; a poller process reads both nodes'
   ``GET /partitions`` back to back and notes when each replica's high seqno covers it (see
   ``bench.cluster_figures.replica_lags`` for the resolution).
3. **Majority write cost**: the same two nodes, bulk ingest (``--clients`` load generator
   processes, ``--concurrency`` requests in flight per node each) with ``durability=majority``
   against ``memory``, alternately, ``--ingest-rounds`` rounds; the median of the per-round
   ratios.  A server that refuses ``majority`` gets "n/a".
4. **Aggregate ingest**: two nodes without replicas (each active for half the partitions)
   against one node, same client processes and the same total requests in flight, alternately;
   the median of the per-round ratios.

Performance is never asserted: the goals are printed beside the figures.  Every process started
here is stopped by its PID on exit, Ctrl-C or error (``bench.suite.procs.ProcessGroup``).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from bench.bench_http import RawConnection
from bench.cluster_figures import (Ack, Figure, Poll, median_ratio, poll_period, replica_lags, summary_ms, table,
                                   verdict)
from bench.cluster_procs import BenchCluster, key_in_partition, partition_of, start_etcd
from bench.suite.procs import SPAWNED, ProcessGroup, stop_everything
from tests.support.server import ROOT, server_env


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- 1. failover time


@dataclass
class FailoverRound:
    victim: str
    partitions: int
    #: per partition: seconds from SIGKILL to the first accepted write, and to the first map naming a live active
    writable: dict[int, float]
    mapped: dict[int, float]
    failed: list[int]


async def probe_failover(cluster: BenchCluster, victim: str, keys: dict[int, str], killed_at: float,
                         map_poll_s: float, timeout: float) -> FailoverRound:
    """Write to each of ``keys``' partitions through the newest map until a write is accepted."""
    victim_url = cluster.nodes[victim].url
    survivors = [n.url for n in cluster.live()]
    newest: dict[str, Any] = {"revision": -1, "actives": {}}
    mapped: dict[int, float] = {}
    writable: dict[int, float] = {}
    deadline = killed_at + timeout
    limits = httpx.Limits(max_connections=len(keys) + len(survivors) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(2.0), limits=limits) as client:

        async def watch_map(url: str) -> None:
            while len(writable) < len(keys) and time.monotonic() < deadline:
                try:
                    view = (await client.get(f"{url}/cluster")).json()
                    revision = view["map"]["revision"]
                    if revision > newest["revision"]:
                        urls = {n["name"]: n["url"] for n in view["nodes"] if n["state"] == "up"}
                        actives = {e["partition"]: urls.get(e["active"]) for e in view["map"]["partitions"]}
                        newest.update(revision=revision, actives=actives)
                        now = time.monotonic()
                        for p in keys:
                            if p not in mapped and actives.get(p) not in (None, victim_url):
                                mapped[p] = now - killed_at
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                await asyncio.sleep(map_poll_s)

        async def probe(p: int, key: str) -> None:
            url: str | None = None
            while time.monotonic() < deadline:
                url = url or newest["actives"].get(p)
                if url is None or url == victim_url:
                    url = None
                    await asyncio.sleep(map_poll_s)
                    continue
                try:
                    r = await client.put(f"{url}/docs/{key}", content=b'"probe"')
                except httpx.HTTPError:
                    url = None
                    await asyncio.sleep(map_poll_s)
                    continue
                if r.status_code == 200:
                    writable[p] = time.monotonic() - killed_at
                    return
                named = r.json().get("url") if r.status_code == 421 else None
                url = named if named and named != url and named != victim_url else None
                if url is None:
                    await asyncio.sleep(map_poll_s)

        await asyncio.gather(*(watch_map(u) for u in survivors), *(probe(p, k) for p, k in keys.items()))
    return FailoverRound(victim, len(keys), writable, mapped, sorted(set(keys) - set(writable)))


def seed_data(cluster: BenchCluster, items: int, tag: str) -> None:
    """``items`` memory writes spread over the partitions, so replicas hold data when a node dies."""
    actives = cluster.actives()
    by_url: dict[str, list[dict[str, str]]] = {}
    for i in range(items):
        key = f"{tag}-{i}"
        by_url.setdefault(actives[partition_of(key, cluster.partitions)], []).append(
            {"op": "set", "key": key, "value": "x" * 180})
    for url, ops in by_url.items():
        r = httpx.post(f"{url}/docs/_bulk", params={"durability": "memory", "results": "columns"}, json=ops, timeout=60)
        if r.status_code != 200 or r.json()["failed"]:
            raise RuntimeError(f"seeding {url} failed: {r.status_code} {r.text[:300]}")


def failover_rounds(group: ProcessGroup, workdir: Path, etcd: str, args: argparse.Namespace) -> list[FailoverRound]:
    cluster = BenchCluster(group, workdir, etcd, "fo", args.partitions, replicas=1, size=3,
                           lease_ttl_s=args.lease_ttl).start()
    rnd = random.Random(args.seed)
    keys = {p: key_in_partition(p, args.partitions, "probe") for p in range(args.partitions)}
    rounds: list[FailoverRound] = []
    try:
        for r in range(args.rounds):
            seed_data(cluster, args.seed_items, f"seed{r}")
            cluster.wait_until(cluster.placed_and_followed, 180, "every replica in sync")
            view = cluster.view()
            owned: dict[str, list[int]] = {}
            for entry in view["map"]["partitions"]:
                owned.setdefault(entry["active"], []).append(entry["partition"])
            most = max(len(ps) for ps in owned.values())
            tied = sorted(n for n, ps in owned.items() if len(ps) == most)
            victim = tied[r % len(tied)]
            time.sleep(rnd.uniform(0, args.lease_ttl))
            killed_at = cluster.kill(victim)
            result = asyncio.run(probe_failover(cluster, victim, {p: keys[p] for p in owned[victim]}, killed_at,
                                                args.map_poll_ms / 1000, timeout=60))
            rounds.append(result)
            times = sorted(result.writable.values())
            progress(f"failover round {r + 1}/{args.rounds}: killed {victim} ({len(owned[victim])} active "
                     f"partitions): all writable after {max(times, default=float('nan')):.2f} s"
                     + (f", never writable: {result.failed}" if result.failed else ""))
            cluster.restart(victim)
    finally:
        cluster.stop()
    return rounds


# ---------------------------------------------------------------------------- 2. replication lag


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


async def paced_writer(actives: dict[int, str], partitions: int, rate: float, tick: float, start_at: float,
                       stop_at: float, max_in_flight: int = 16) -> tuple[list[Ack], int, int]:
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
            if due >= stop_at:
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
    lags: list[float]
    unseen: int
    sent: int
    errors: int
    seconds: float
    period_ms: float
    polls: int


def measure_lag(group: ProcessGroup, cluster: BenchCluster, args: argparse.Namespace) -> LagResult:
    actives = cluster.actives()
    urls = sorted({n.url for n in cluster.live()})
    start_at = time.monotonic() + 3.0  # the poller's start-up, then a second of warm-up writes
    stop_at = start_at + args.lag_seconds
    poller = group.spawn([sys.executable, "-m", "bench.cluster_poll", *urls, "--start-at", f"{start_at - 1:.6f}",
                          "--stop-at", f"{stop_at + 1:.6f}", "--interval-ms", str(args.lag_poll_ms)], name="poller", cwd=ROOT, env=server_env(),
                         stdout=subprocess.PIPE, log=cluster.workdir / "poller.log")
    time.sleep(max(0.0, start_at - 1 - time.monotonic()))
    acks, sent, errors = asyncio.run(paced_writer(actives, args.partitions, args.lag_rate, args.lag_tick_ms / 1000,
                                                  start_at, stop_at))
    out, _ = poller.communicate(timeout=60 + args.lag_seconds)
    group.stop(poller)
    if poller.returncode != 0:
        raise RuntimeError(f"the replica poller failed ({poller.returncode}); see {cluster.workdir / 'poller.log'}")
    polled = orjson.loads(out)
    replica_of = {e["partition"]: cluster.nodes[e["replicas"][0]["node"]].url for e in cluster.view()["map"]["partitions"]}
    lags: list[float] = []
    unseen = 0
    for url in urls:
        polls = [Poll(s, r, {int(p): h for p, h in highs.items()}) for s, r, highs in polled[url]["polls"]]
        mine = [a for a in acks if replica_of[a.partition] == url]
        got, missing = replica_lags(mine, polls)
        lags += got
        unseen += missing
    periods = [polled[u]["period"] for u in urls if polled[u]["period"] is not None]
    return LagResult(lags, unseen, sent, errors, args.lag_seconds,
                     statistics.median(periods) * 1000 if periods else float("nan"),
                     sum(polled[u]["count"] for u in urls))


# ---------------------------------------------------------------------------- 3./4. bulk ingest


@dataclass
class IngestResult:
    label: str
    items: int
    errors: int
    seconds: float
    #: CPU use of each node process over the window (1.0 = one core)
    node_cpu: list[float]
    #: CPU use of all the load generator processes together over the window
    client_cpu: float

    @property
    def rate(self) -> float:
        return self.items / self.seconds


def ingest(group: ProcessGroup, cluster: BenchCluster, label: str, durability: str, args: argparse.Namespace,
           concurrency: int, tag: str) -> IngestResult:
    """``args.clients`` load generator processes against ``cluster``'s actives for ``args.ingest_seconds``."""
    targets = json.dumps({str(p): url for p, url in cluster.actives().items()})
    start_at = time.monotonic() + 2.5 + args.warmup  # process start-up and body building, then warm-up
    stop_at = start_at + args.ingest_seconds
    procs = [group.spawn([sys.executable, "-m", "bench.cluster_load", "--targets", targets,
                          "--durability", durability, "--concurrency", str(concurrency),
                          "--batch", str(args.batch), "--prefix", f"{tag}-c{c}", "--seed", str(c),
                          "--start-at", f"{start_at:.6f}", "--stop-at", f"{stop_at:.6f}"],
                         name=f"load {c}", cwd=ROOT, env=server_env(), stdout=subprocess.PIPE,
                         log=cluster.workdir / f"load-{tag}-{c}.log")
             for c in range(args.clients)]
    nodes = [psutil.Process(n.proc.pid) for n in cluster.live() if n.proc is not None]
    loaders = [psutil.Process(proc.pid) for proc in procs]
    time.sleep(max(0.0, start_at - time.monotonic()))
    cpu0 = [sum(p.cpu_times()[:2]) for p in nodes + loaders]
    time.sleep(max(0.0, stop_at - time.monotonic()))
    cpu1 = [sum(p.cpu_times()[:2]) for p in nodes + loaders]
    items = errors = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        group.stop(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"a load generator failed ({proc.returncode}); see {cluster.workdir}/load-{tag}-*.log")
        counts = orjson.loads(out)
        items += int(counts["items"])
        errors += int(counts["errors"])
    seconds = stop_at - start_at
    used = [(b - a) / seconds for a, b in zip(cpu0, cpu1)]
    return IngestResult(label, items, errors, seconds, used[:len(nodes)], sum(used[len(nodes):]))


def durability_supported(cluster: BenchCluster, level: str) -> bool:
    """Whether the nodes accept ``durability=<level>`` (a one-item bulk write to its active): a
    server that does not know the level refuses it as invalid input naming the parameter."""
    key = f"{level}-probe"
    url = cluster.actives()[partition_of(key, cluster.partitions)]
    r = httpx.post(f"{url}/docs/_bulk", params={"durability": level},
                   json=[{"op": "set", "key": key, "value": 1}], timeout=30)
    if r.status_code == 200:
        return True
    if r.status_code in (400, 422) and "durability" in r.text:
        return False
    raise RuntimeError(f"probing durability={level} on {url}: unexpected {r.status_code} {r.text[:300]}")


# ---------------------------------------------------------------------------- the run


FIGURES = ("failover", "lag", "majority", "aggregate")


def run(args: argparse.Namespace) -> list[Figure]:
    work = Path(tempfile.mkdtemp(prefix="upr-bench-cluster-"))
    figures: list[Figure] = []
    wanted = set(args.only)
    try:
        with ProcessGroup() as group:
            etcd = start_etcd(group, work)
            progress(f"etcd at {etcd}")
            if "failover" in wanted:
                progress(f"failover: three nodes, one replica, {args.rounds} rounds")
                figures.append(failover_figure(failover_rounds(group, work, etcd, args), args))
            if wanted & {"lag", "majority"}:
                progress("two nodes, one replica: replication lag, then majority vs memory ingest")
                pair = BenchCluster(group, work, etcd, "rep", args.partitions, replicas=1, size=2,
                                    lease_ttl_s=args.lease_ttl).start()
                if "lag" in wanted:
                    pair.wait_until(pair.placed_and_followed, 120, "every replica in sync")
                    figures.append(lag_figure(measure_lag(group, pair, args), args))
                if "majority" in wanted:
                    figures.append(majority_figure(group, pair, args))
                pair.stop()
            if "aggregate" in wanted:
                progress("aggregate ingest: one node against two nodes without replicas")
                one = BenchCluster(group, work, etcd, "one", args.partitions, replicas=0, size=1,
                                   lease_ttl_s=args.lease_ttl).start()
                two = BenchCluster(group, work, etcd, "two", args.partitions, replicas=0, size=2,
                                   lease_ttl_s=args.lease_ttl).start()
                singles, pairs = [], []
                for r in range(args.ingest_rounds):
                    singles.append(ingest(group, one, "one node", "memory", args, 2 * args.concurrency, f"one{r}"))
                    pairs.append(ingest(group, two, "two nodes", "memory", args, args.concurrency, f"two{r}"))
                    progress(f"aggregate round {r + 1}: one node {singles[-1].rate:,.0f}/s, "
                             f"two nodes {pairs[-1].rate:,.0f}/s")
                figures.append(ratio_figure("aggregate ingest, two nodes / one node (no replicas)", pairs, singles,
                                            1.6, args))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures


def majority_figure(group: ProcessGroup, pair: BenchCluster, args: argparse.Namespace) -> Figure:
    level = args.durable
    name = f"{level} / memory bulk ingest (2 nodes, 1 replica)"
    if not durability_supported(pair, level):
        return Figure(name, "n/a (not supported by this server)", "≥ 0.7", "n/a")
    memory, durable = [], []
    for r in range(args.ingest_rounds):
        memory.append(ingest(group, pair, "memory", "memory", args, args.concurrency, f"mem{r}"))
        durable.append(ingest(group, pair, level, level, args, args.concurrency, f"dur{r}"))
        progress(f"ingest round {r + 1}: memory {memory[-1].rate:,.0f}/s, {level} {durable[-1].rate:,.0f}/s")
    return ratio_figure(name, durable, memory, 0.7, args)


def failover_figure(rounds: list[FailoverRound], args: argparse.Namespace) -> Figure:
    per_partition = [t for r in rounds for t in r.writable.values()]
    mapped = [t for r in rounds for t in r.mapped.values()]
    failed = sum(len(r.failed) for r in rounds)
    if not per_partition:
        return Figure("failover time", "no partition became writable", "max ≤ 3 s", "NOT met")
    s = summary_ms(per_partition)
    worst = max(per_partition) + (float("inf") if failed else 0.0)
    result = (f"p50 {s['p50'] / 1000:.2f} s, max {s['p100'] / 1000:.2f} s over {len(rounds)} rounds, "
              f"{len(per_partition)} partitions" + (f"; {failed} never writable in 60 s" if failed else ""))
    m = summary_ms(mapped) if mapped else None
    method = (f"SIGKILL to the first accepted PUT per partition of the killed node (3 nodes, {args.partitions} "
              f"partitions, 1 replica, lease TTL {args.lease_ttl} s, map polled every {args.map_poll_ms:g} ms); "
              f"victims {', '.join(r.victim for r in rounds)}"
              + (f"; new active in the map after p50 {m['p50'] / 1000:.2f} s, max {m['p100'] / 1000:.2f} s" if m else ""))
    return Figure("failover time", result, f"max ≤ 3 s (TTL {args.lease_ttl} s)", verdict(worst, 3.0, False), method)


def lag_figure(res: LagResult, args: argparse.Namespace) -> Figure:
    achieved = len(res.lags) / res.seconds
    if not res.lags:
        return Figure("replication lag", "no write was seen on a replica", "p99 ≤ 20 ms", "NOT met")
    s = summary_ms(res.lags)
    result = (f"p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms, max {s['p100']:.1f} ms "
              f"({len(res.lags):,} writes at {achieved:,.0f}/s"
              + (f"; {res.unseen} never seen, {res.errors} errors" if res.unseen or res.errors else "") + ")")
    method = (f"paced memory bulk writes, {args.lag_rate:,.0f}/s offered in bulks every {args.lag_tick_ms:g} ms per "
              f"node, 2 nodes x 1 replica, {args.lag_seconds:g} s; ack time at the writer vs the midpoint of the first "
              f"GET /partitions poll of the replica's node whose high seqno covers it (same-host monotonic clock); "
              f"resolution: one poll period, median {res.period_ms:.1f} ms ({res.polls:,} polls)")
    return Figure("replication lag", result, "p99 ≤ 20 ms", verdict(s["p99"], 20.0, False), method)


def ratio_figure(name: str, measured: list[IngestResult], base: list[IngestResult], goal: float,
                 args: argparse.Namespace) -> Figure:
    ratio, ratios = median_ratio([r.rate for r in measured], [r.rate for r in base])
    errors = sum(r.errors for r in measured + base)

    def rates(rs: list[IngestResult]) -> str:
        return "/".join(f"{r.rate:,.0f}" for r in rs)

    def cpus(rs: list[IngestResult]) -> str:
        return "/".join("+".join(f"{c:.0%}" for c in r.node_cpu) for r in rs)

    def client_cpus(rs: list[IngestResult]) -> str:
        return "/".join(f"{r.client_cpu:.0%}" for r in rs)

    result = (f"{ratio:.2f} (rounds {', '.join(f'{x:.2f}' for x in ratios)}; {measured[0].label} "
              f"{rates(measured)}/s, {base[0].label} {rates(base)}/s" + (f"; {errors} errors" if errors else "") + ")")
    method = (f"{args.clients} load processes x {args.concurrency} bulks of {args.batch} in flight per node "
              f"(the single node gets the same total), {args.ingest_seconds:g} s per phase after {args.warmup:g} s "
              f"warm-up, phases alternating, per round: node CPU (1 core = 100%) {measured[0].label} {cpus(measured)}, "
              f"{base[0].label} {cpus(base)}; load processes' CPU {measured[0].label} {client_cpus(measured)}, "
              f"{base[0].label} {client_cpus(base)}")
    return Figure(name, result, f"≥ {goal:g}", verdict(ratio, goal, True), method)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny settings: 2 failover rounds, short phases")
    p.add_argument("--rounds", type=int, default=10, help="failover rounds")
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--lease-ttl", type=int, default=2, help="node lease TTL in seconds")
    p.add_argument("--map-poll-ms", type=float, default=10.0, help="how often the failover probe reads the map")
    p.add_argument("--seed-items", type=int, default=2000, help="writes before each failover round")
    p.add_argument("--lag-rate", type=float, default=5000.0, help="offered memory writes/s for the lag")
    p.add_argument("--lag-tick-ms", type=float, default=10.0, help="one bulk per node every this many ms")
    p.add_argument("--lag-seconds", type=float, default=20.0)
    p.add_argument("--lag-poll-ms", type=float, default=2.0,
                   help="pause between two polls of a replica node's high seqnos (each poll costs the node CPU)")
    p.add_argument("--ingest-seconds", type=float, default=5.0, help="measured seconds per ingest phase")
    p.add_argument("--ingest-rounds", type=int, default=3)
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each ingest phase counts")
    p.add_argument("--clients", type=int, default=2, help="load generator processes")
    p.add_argument("--concurrency", type=int, default=4, help="bulks in flight per node per load process")
    p.add_argument("--batch", type=int, default=1000, help="items per bulk")
    p.add_argument("--durable", default="majority",
                   help="the durability level whose ingest is compared with memory (persist tries the harness "
                        "on a server without majority)")
    p.add_argument("--seed", type=int, default=14, help="seeds the pause before each kill")
    p.add_argument("--only", type=lambda v: v.split(","), default=list(FIGURES),
                   help=f"comma-separated subset of {','.join(FIGURES)}")
    p.add_argument("--json", type=Path, help="also write the figures (and the PIDs of every process started) here")
    if "--quick" in (sys.argv[1:] if argv is None else argv):  # smaller defaults; explicit flags still win
        p.set_defaults(rounds=2, partitions=16, seed_items=200, lag_seconds=2.0, ingest_seconds=1.0, ingest_rounds=1,
                       warmup=0.5, clients=1, concurrency=2, batch=200)
    args = p.parse_args(argv)
    if not args.only or set(args.only) - set(FIGURES):
        p.error(f"--only takes a comma-separated subset of {','.join(FIGURES)}")
    signal.signal(signal.SIGTERM, lambda *_: (stop_everything(), sys.exit(143)))
    started = time.monotonic()
    figures = run(args)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
          f"{time.monotonic() - started:.0f} s in all\n")
    print(table(figures))
    if args.json:
        args.json.write_text(json.dumps({"figures": [dataclasses.asdict(f) for f in figures],
                                         "processes": [{"pid": pid, "name": name} for pid, name in SPAWNED]},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
