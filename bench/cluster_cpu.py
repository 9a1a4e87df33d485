"""CPU of a replicating pair per bulk request and per write, at a paced ``memory`` write rate,
without an observer: the load-independent signal for the replication path.

Two nodes, one replica each way (as ``bench.bench_cluster --only lag``), the same paced writer
(one bulk per node every ``--tick-ms``), each node's CPU seconds over the window divided by the
bulks and the writes it took.  A rate of 0 measures the pair idle (cluster up, no writes): the
fixed cost every per-bulk figure stands on.  A rate below one write per tick writes one item per
``1/rate`` s instead.  ``--pyspy DIR`` also records both nodes with py-spy (raw, idle
samples left out) into DIR for the window, one line per thread.

Each node's CPU is also split by thread (``/proc/PID/task``, named from ``py-spy dump``: the
event loop ``MainThread``, ``upr-writer``, ``upr-flusher``, the ``asyncio.to_thread`` pool
``uvloop``, ``upr-reader``, ...), per bulk and per write that node took as the active, with its
voluntary and involuntary context switches per bulk: wake-ups and GIL hand-offs are what a
replicating node pays per bulk, whatever the bulk carries::

    PYTHONPATH=. python -m bench.cluster_cpu --rates 500,5000 --seconds 10
    PYTHONPATH=. python -m bench.cluster_cpu --rates 0,50,500,5000 --seconds 10
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from bench.cluster_lag import CpuWindow, paced_writer
from bench.cluster_procs import BenchCluster, start_etcd
from bench.thread_stats import python_thread_names, thread_stats
from bench.suite.procs import ProcessGroup


def etcd_requests(url: str) -> dict[str, float]:
    """etcd's handled gRPC requests so far, per method (the JSON gateway's calls land there too)."""
    counts: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("grpc_server_handled_total{"):
            method = line.split('grpc_method="', 1)[1].split('"', 1)[0]
            counts[method] = counts.get(method, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


#: ``/metrics`` lines read from each node (absent on a tree without them: 0), by short name
NODE_COUNTERS = {
    'upr_cluster_replica_applies_total{path="inline"}': "inline",
    'upr_cluster_replica_applies_total{path="thread"}': "thread",
    "upr_cluster_replica_progress_writes_total": "progress txns",
    "upr_engine_flush_count_total": "flusher commits",
    "upr_engine_flush_rounds_total": "flusher rounds",
    "upr_engine_flush_gathered_rounds_total": "gathered rounds",
    "upr_engine_lmdb_commits_total": "lmdb commits",
    "upr_engine_flush_cpu_seconds_total": "flusher cpu s",
    'upr_cluster_replication_events_total{event="messages"}': "messages received",
    'upr_cluster_replication_events_total{event="takes"}': "applier takes",
    'upr_cluster_replication_events_total{event="acks"}': "acks",
    'upr_cluster_replication_events_total{event="ack_messages"}': "ack messages",
    'upr_cluster_replication_events_total{event="ack_looks"}': "acker looks",
    'upr_cluster_replication_events_total{event="persist_handoffs"}': "persist handoffs",
    'upr_cluster_replication_events_total{event="flow_acks"}': "flow acks",
    'upr_cluster_replication_events_total{event="packed_passes"}': "packed passes",
    'upr_cluster_replication_events_total{event="packed_sections"}': "packed sections",
    "upr_cluster_etcd_requests_total": "etcd requests",
}


def node_counters(url: str) -> dict[str, float]:
    """The replication path's counters of one node's ``/metrics`` (``NODE_COUNTERS``)."""
    out = {name: 0.0 for name in NODE_COUNTERS.values()}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        head, _, value = line.rpartition(" ")
        if head in NODE_COUNTERS:
            out[NODE_COUNTERS[head]] = float(value)
    return out


TaskSnapshot = dict[int, tuple[str, float, int, int]]


def task_snapshot(pid: int) -> TaskSnapshot:
    """Each thread of a process: its kernel name, CPU seconds (user + system), voluntary and
    involuntary context switches so far."""
    return {tid: (t.name, t.cpu_s, t.voluntary, t.involuntary) for tid, t in thread_stats(pid).items()}


class ThreadWindow(CpuWindow):
    """``CpuWindow`` that also snapshots every thread of each process at the window's two ends."""

    def __init__(self, procs: list[psutil.Process], start_at: float, stop_at: float) -> None:
        super().__init__(procs, start_at, stop_at)
        self.tasks_first: list[TaskSnapshot] | None = None
        self.tasks_last: list[TaskSnapshot] | None = None

    def sample(self, now: float) -> None:
        if self.first is None and now >= self.start_at:
            self.tasks_first = [task_snapshot(p.pid) for p in self.procs]
        elif self.last is None and now >= self.stop_at:
            self.tasks_last = [task_snapshot(p.pid) for p in self.procs]
        super().sample(now)

    def per_thread(self, index: int, names: dict[int, str]) -> dict[str, tuple[float, int, int]]:
        """Process ``index``'s CPU seconds, voluntary and involuntary switches over the window,
        per thread name (threads of one name added up)."""
        if self.tasks_first is None or self.tasks_last is None:
            return {}
        first, last = self.tasks_first[index], self.tasks_last[index]
        out: dict[str, tuple[float, int, int]] = {}
        for tid, (comm, cpu, vol, invol) in last.items():
            c0, v0, n0 = first.get(tid, (comm, 0.0, 0, 0))[1:]
            name = names.get(tid, comm)
            cpu_s, v, n = out.get(name, (0.0, 0, 0))
            out[name] = (cpu_s + cpu - c0, v + vol - v0, n + invol - n0)
        return out


def thread_table(window: ThreadWindow, nodes: list, bulks: dict[str, int], writes: dict[str, int]) -> list[str]:
    """One line per node and thread: CPU per bulk and per write the node took, share of a core,
    switches per bulk; threads under 0.5 % of a core are added up as "other"."""
    lines = []
    span = window.stop_at - window.start_at
    for i, node in enumerate(nodes):
        names = python_thread_names(node.proc.pid)
        rows = window.per_thread(i, names)
        n_bulks = max(bulks.get(node.url, 0), 1)
        n_writes = max(writes.get(node.url, 0), 1)
        total = sum(r[0] for r in rows.values())
        tv, tn = sum(r[1] for r in rows.values()), sum(r[2] for r in rows.values())
        lines.append(f"    {node.name}: {total / span:.1%} of a core, {total / n_bulks * 1e6:,.0f} µs per bulk "
                     f"({bulks.get(node.url, 0)} bulks, {writes.get(node.url, 0)} writes), switches per bulk "
                     f"{tv / n_bulks:.1f} voluntary, {tn / n_bulks:.2f} involuntary")
        other = [0.0, 0, 0]
        for name, (cpu_s, v, n) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
            if cpu_s / span < 0.005:
                other[0] += cpu_s
                other[1] += v
                other[2] += n
                continue
            lines.append(f"      {name:22s} {cpu_s / span:6.1%}  {cpu_s / n_bulks * 1e6:7,.0f} µs/bulk  "
                         f"{cpu_s / n_writes * 1e6:6,.0f} µs/write  vol {v / n_bulks:5.2f}/bulk  "
                         f"invol {n / n_bulks:5.2f}/bulk")
        if other[0] or other[1]:
            lines.append(f"      {'(other threads)':22s} {other[0] / span:6.1%}  {other[0] / n_bulks * 1e6:7,.0f} "
                         f"µs/bulk  {'':6s}           vol {other[1] / n_bulks:5.2f}/bulk  "
                         f"invol {other[2] / n_bulks:5.2f}/bulk")
    return lines


async def idle_window(cpu: CpuWindow, stop_at: float) -> None:
    """Sample the nodes' CPU over the window without writing anything."""
    while True:
        now = time.monotonic()
        cpu.sample(now)
        if now >= stop_at:
            return
        await asyncio.sleep(min(0.05, max(stop_at - now, 0.001)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="500,5000", help="offered memory writes/s, comma-separated")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--tick-ms", type=float, default=10.0)
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--pyspy", type=Path, help="record both nodes with py-spy into this directory")
    p.add_argument("--pyspy-idle", action="store_true",
                   help="with --pyspy: record idle samples too (--idle) instead of only GIL holders (--gil)")
    p.add_argument("--nice", type=int, default=0,
                   help="run both nodes and this writer at this nice value (negative: ahead of other load, "
                        "so their wake-ups are what a calmer machine makes of the writes; needs root)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set in both nodes' environment (e.g. UPR_FLUSH_INTERVAL_MS=20); repeatable")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="upr-bench-cpu-"))
    print(f"load average {os.getloadavg()[0]:.1f} at the start; nice {args.nice}", flush=True)
    try:
        with ProcessGroup() as group:
            etcd = start_etcd(group, work)
            pair = BenchCluster(group, work, etcd, "cpu", args.partitions, replicas=1, size=2, lease_ttl_s=6,
                                env=dict(e.split("=", 1) for e in args.env)).start()
            pair.wait_until(pair.placed_and_followed, 300, "every replica in sync")
            actives = pair.actives()
            nodes = [n for n in pair.live() if n.proc is not None]
            procs = [psutil.Process(n.proc.pid) for n in nodes]  # type: ignore[union-attr]
            if args.nice:
                for proc in [*procs, psutil.Process()]:
                    for thread in proc.threads():  # a process's nice value is per thread on Linux
                        os.setpriority(os.PRIO_PROCESS, thread.id, args.nice)
            for rate in (float(r) for r in args.rates.split(",")):
                spies = []
                if args.pyspy:
                    args.pyspy.mkdir(parents=True, exist_ok=True)
                    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                    for n in nodes:
                        assert n.proc is not None
                        spies.append(subprocess.Popen(
                            [spy, "record", "-r", "200", "-f", "raw", "--nonblocking", "--threads",
                             "--idle" if args.pyspy_idle else "--gil", "-d",
                             str(int(args.seconds + 1)), "-o", str(args.pyspy / f"{n.name}-{rate:.0f}.txt"),
                             "--pid", str(n.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                start_at = time.monotonic() + 1.0
                stop_at = start_at + args.seconds
                cpu = ThreadWindow(procs, start_at, stop_at)
                etcd_before = etcd_requests(etcd)
                nodes_before = [node_counters(n.url) for n in nodes]
                tick = max(args.tick_ms / 1000, 1 / rate) if rate > 0 else args.tick_ms / 1000
                sent_bulks: dict[str, int] = {}
                sent_writes: dict[str, int] = {}
                if rate > 0:
                    acks, sent, errors = asyncio.run(paced_writer(actives, args.partitions, rate, tick,
                                                                  start_at, stop_at, cpu, bulks=sent_bulks,
                                                                  writes=sent_writes))
                else:
                    sent, errors = 0, 0
                    asyncio.run(idle_window(cpu, stop_at))
                etcd_after = etcd_requests(etcd)
                moved = {k: sum(node_counters(n.url)[k] - b[k] for n, b in zip(nodes, nodes_before))
                         for k in nodes_before[0]}
                for s in spies:
                    s.wait()
                # writes last about the window plus its 1 s lead
                etcd_rate = {m: (etcd_after.get(m, 0) - n) / (args.seconds + 1) for m, n in etcd_before.items()}
                etcd_txt = ", ".join(f"{m} {r:.1f}/s" for m, r in sorted(etcd_rate.items()) if r >= 0.05)
                used = cpu.used()
                bulks = sum(sent_bulks.values())  # both nodes
                parts = ", ".join(f"{c:.1%}" for c in used)
                per_bulk = sum(used) * args.seconds / max(bulks, 1) * 1e3
                per_write = sum(used) * args.seconds / max(sent, 1) * 1e6
                print(f"{rate:,.0f}/s: nodes' CPU {parts}; per bulk (per node) {per_bulk:.2f} ms; "
                      f"per write (both nodes) {per_write:.0f} µs; {bulks} bulks, {sent} sent, {errors} errors; "
                      f"etcd requests {etcd_txt}; replica runs applied inline {moved['inline']:.0f}, on a "
                      f"thread {moved['thread']:.0f}, progress txns {moved['progress txns']:.0f}; load {os.getloadavg()[0]:.1f}", flush=True)
                # per second per node: the replication path's wake-ups and messages
                span = (args.seconds + 1) * len(nodes)
                print("    per node per second: " + ", ".join(
                    f"{k} {v / span:.3g}" for k, v in moved.items() if k not in ("inline", "thread", "progress txns")),
                    flush=True)
                print("\n".join(thread_table(cpu, nodes, sent_bulks, sent_writes)), flush=True)
                time.sleep(2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
