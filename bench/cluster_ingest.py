"""Bulk ingest phases for ``bench.bench_cluster``: the majority write cost and the aggregate ingest.

A phase runs ``--clients`` load generator processes (``bench.cluster_load``) against a cluster's
actives for ``--ingest-seconds`` after a warm-up, and samples the CPU of the nodes and of the
load generators over the same window, so that a saturated server can be told from a
client-bound run.  Figures are ratios of phases run alternately, one ratio per round.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import orjson
import psutil

from bench.cluster_figures import Figure, median_ratio, verdict
from bench.cluster_procs import BenchCluster, partition_of, progress, release_together
from bench.suite.procs import ProcessGroup
from tests.support.server import ROOT, server_env



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
           concurrency: int, tag: str, settle: tuple[BenchCluster, ...] = ()) -> IngestResult:
    """``args.clients`` load generator processes against ``cluster``'s actives for ``args.ingest_seconds``.

    First every cluster in ``settle`` (and ``cluster``) must have persisted what it holds: the
    flusher of a phase that just ended would otherwise take CPU from this one."""
    for quiet in {id(c): c for c in (cluster, *settle)}.values():
        quiet.wait_until(quiet.persisted, 300, "everything persisted before an ingest phase")
    targets = json.dumps({str(p): url for p, url in cluster.actives().items()})
    procs = [group.spawn([sys.executable, "-m", "bench.cluster_load", "--targets", targets,
                          "--durability", durability, "--concurrency", str(concurrency),
                          "--batch", str(args.batch), "--prefix", f"{tag}-c{c}", "--seed", str(c)],
                         name=f"load {c}", cwd=ROOT, env=server_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         log=cluster.workdir / f"load-{tag}-{c}.log")
             for c in range(args.clients)]
    nodes = [psutil.Process(n.proc.pid) for n in cluster.live() if n.proc is not None]
    loaders = [psutil.Process(proc.pid) for proc in procs]
    start_at, stop_at = release_together(procs, args.warmup, args.ingest_seconds)
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


def majority_figure(group: ProcessGroup, pair: BenchCluster, args: argparse.Namespace) -> Figure:
    """``args.durable`` (majority) against memory bulk ingest on two nodes with one replica.

    Each phase starts once every replica has caught up: a backlog left by the phase before
    would otherwise be paid by the next one (a majority write waits for its replica)."""
    level = args.durable
    name = f"{level} / memory bulk ingest (2 nodes, 1 replica)"
    if not durability_supported(pair, level):
        return Figure(name, "n/a (not supported by this server)", "≥ 0.7", "n/a")
    memory, durable = [], []

    def caught_up() -> None:
        pair.wait_until(pair.placed_and_followed, 300, "every replica in sync before an ingest phase")

    for r in range(args.ingest_rounds):
        caught_up()
        memory.append(ingest(group, pair, "memory", "memory", args, args.concurrency, f"mem{r}"))
        caught_up()
        durable.append(ingest(group, pair, level, level, args, args.concurrency, f"dur{r}"))
        progress(f"ingest round {r + 1}: memory {memory[-1].rate:,.0f}/s, {level} {durable[-1].rate:,.0f}/s")
    return ratio_figure(name, durable, memory, 0.7, args, "each phase starts with every replica in sync")


def ratio_figure(name: str, measured: list[IngestResult], base: list[IngestResult], goal: float,
                 args: argparse.Namespace, setup: str) -> Figure:
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
              f"({setup}), {args.ingest_seconds:g} s per phase after {args.warmup:g} s "
              f"warm-up, phases alternating, per round: node CPU (1 core = 100%) {measured[0].label} {cpus(measured)}, "
              f"{base[0].label} {cpus(base)}; load processes' CPU {measured[0].label} {client_cpus(measured)}, "
              f"{base[0].label} {client_cpus(base)}")
    return Figure(name, result, f"≥ {goal:g}", verdict(ratio, goal, True), method)
