"""The cluster's performance (issue 14): failover time, replication lag, majority write cost and
aggregate ingest, measured in one run on real etcd and real ``upr server --cluster`` processes.

    .venv/bin/python -m bench.bench_cluster              # 10 failover rounds, ~6 minutes
    .venv/bin/python -m bench.bench_cluster --quick      # tiny settings, for trying the harness
    .venv/bin/python -m bench.bench_cluster --rounds 20 --lag-seconds 30
    .venv/bin/python -m bench.bench_cluster --only rebalance   # the rebalance figures (not run by default)

What each figure measures (every process on one host, so one monotonic clock):

1. **Failover time**: three nodes, one replica per partition, lease TTL ``--lease-ttl`` (2 s).
   Once every replica is in sync, after a random pause (so the kill falls anywhere in the
   lease's keep-alive cycle), the node active for the most partitions is SIGKILLed.  For each of
   its partitions a probe writes (``PUT``) to the node the newest map names (the map is read
   from every survivor's ``GET /cluster`` every ``--map-poll-ms``; a 421 is followed at once)
   until a write is accepted: time from the signal to that answer.  Each round is a fresh
   cluster, so that each victim holds its third of the partitions.
2. **Replication lag**: two nodes, one replica each way.  A paced writer sends ``memory`` bulk
   writes at ``--lag-rate`` items/s (one bulk per node per ``--lag-tick-ms``) and records when
   each (partition, seqno) was acknowledged; an observer process tails both nodes' replica
   partitions (``--lag-observe poll``: reads their ``GET /partitions`` every ``--lag-poll-ms``) and
   notes when each replica's high seqno covers it (``bench.cluster_figures.replica_lags``).  Its
   streams are all open before the window, and it stops only once it has seen what the replicas
   hold (``bench.cluster_poll``); ``--keep`` keeps each run's acks and observations
   (``lag-<rate>-*.json``) beside the node logs.  The same at
   ``--lag-baseline-rate`` (500/s) shows what the machine's scheduling alone costs.
3. **Majority write cost**: the same two nodes, bulk ingest (``--clients`` load generator
   processes, ``--concurrency`` requests in flight per node each) with ``durability=majority``
   against ``memory``, alternately, ``--ingest-rounds`` rounds; the median of the per-round
   ratios.  A server that refuses ``majority`` gets "n/a".
4. **Aggregate ingest**: two nodes without replicas (each active for half the partitions)
   against one node (a one-node cluster, so that only the node count differs), same client
   processes and the same total requests in flight, alternately; the median of the per-round
   ratios.

5. **Rebalance** (``bench.cluster_rebalance``): two nodes seeded with ``--rebalance-items``, a third
   added by rebalance: the rate data moves to it as a ratio of a single-node backfill in the same
   run, and each moved partition's write unavailability during its handover (p50/p99).

6. **Consumer throughput** (only with ``--only consume``): ``bench/cluster_consume.py``.

7. **Healthy-partition gap** (only with ``--only gap``, ``bench.cluster_gap``): a consumer tails
   three nodes while one is SIGKILLed; the longest delivery gap on a partition whose active was
   not killed (goal under 100 ms), beside the same window before the kill and the writer's own gap.

Performance is never asserted: the goals are printed beside the figures.  Every process started
here is stopped by its PID on exit, Ctrl-C or error (``bench.suite.procs.ProcessGroup``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.cluster_consume import consume_figure
from bench.cluster_failover import failover_figure, failover_rounds
from bench.cluster_gap import gap_figures, measure_gap
from bench.cluster_figures import Figure, table
from bench.cluster_ingest import ingest, majority_figure, ratio_figure
from bench.cluster_lag import lag_figure, measure_lag, stage_env
from bench.cluster_procs import BenchCluster, progress, start_etcd
from bench.cluster_rebalance import measure_rebalance, rebalance_figures
from bench.suite.procs import SPAWNED, ProcessGroup, stop_everything

FIGURES = ("failover", "lag", "majority", "aggregate", "rebalance", "consume", "gap")
#: what runs without ``--only`` (rebalance, consume and gap run their own clusters: ask for them)
DEFAULT_FIGURES = ("failover", "lag", "majority", "aggregate")


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
                rounds = failover_rounds(group, work, etcd, args)
                figures.append(failover_figure(rounds, args))
                if any(r.failed for r in rounds):  # the nodes' logs are the evidence
                    args.keep = True
            if wanted & {"lag", "majority"}:
                progress("two nodes, one replica: replication lag, then majority vs memory ingest")
                pair = BenchCluster(group, work, etcd, "rep", args.partitions, replicas=1, size=2,
                                    lease_ttl_s=args.lease_ttl, env=stage_env(args, work)).start()
                if "lag" in wanted:
                    # the baseline first: a backlog the goal's rate may leave cannot touch it
                    base = (measure_lag(group, pair, args.lag_baseline_rate, args)
                            if args.lag_baseline_rate > 0 else None)
                    figures.append(lag_figure(measure_lag(group, pair, args.lag_rate, args), args))
                    if base is not None:
                        figures.append(lag_figure(base, args, baseline=True))
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
                    singles.append(ingest(group, one, "one node", "memory", args, 2 * args.concurrency, f"one{r}",
                                          settle=(two,)))
                    pairs.append(ingest(group, two, "two nodes", "memory", args, args.concurrency, f"two{r}",
                                        settle=(one,)))
                    progress(f"aggregate round {r + 1}: one node {singles[-1].rate:,.0f}/s, "
                             f"two nodes {pairs[-1].rate:,.0f}/s")
                figures.append(ratio_figure("aggregate ingest, two nodes / one node (no replicas)", pairs, singles,
                                            1.6, args, "a one-node cluster gets the same total"))
            if "consume" in wanted:  # bench/cluster_consume.py
                figures += consume_figure(group, work, etcd, args)
            if "gap" in wanted:
                progress("gap: three nodes, one replica, a consumer tailing them all, one node SIGKILLed")
                figures.extend(gap_figures(measure_gap(group, work, etcd, args), args))
            if "rebalance" in wanted:
                progress("rebalance: two nodes, one replica, then a third added by rebalance")
                figures.extend(rebalance_figures(measure_rebalance(group, work, etcd, args), args))
    finally:
        if args.keep:
            progress(f"logs and data kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny settings: 2 failover rounds, short phases")
    p.add_argument("--rounds", type=int, default=10, help="failover rounds")
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--lease-ttl", type=int, default=2, help="node lease TTL in seconds")
    p.add_argument("--map-poll-ms", type=float, default=10.0, help="how often the failover probe reads the map")
    p.add_argument("--seed-items", type=int, default=2000, help="writes before each failover round")
    p.add_argument("--lag-rate", type=float, default=5000.0, help="offered memory writes/s for the lag")
    p.add_argument("--lag-baseline-rate", type=float, default=500.0,
                   help="the lag once more at this low rate, beside the goal's (0: skip)")
    p.add_argument("--lag-tick-ms", type=float, default=10.0, help="one bulk per node every this many ms")
    p.add_argument("--lag-seconds", type=float, default=20.0)
    p.add_argument("--lag-drain", type=float, default=30.0,
                   help="seconds the replicas get after the writes to hold them all (later: an infinite lag)")
    p.add_argument("--lag-observe", choices=("stream", "poll"), default="stream",
                   help="how the replicas are watched: a tail of their replica partitions (pushed by the node) "
                        "or GET /partitions polls every --lag-poll-ms")
    p.add_argument("--lag-stages", action="store_true",
                   help="a diagnostic: the replicas stamp each batch they receive and apply, the observer also "
                        "tails the actives, and the lag figures say how long each stage took (p50/p99)")
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
    p.add_argument("--consume-items", type=int, default=500_000, help="items the consume figure reads")
    p.add_argument("--consume-value-bytes", type=int, default=100)
    p.add_argument("--seed", type=int, default=14, help="seeds the pause before each kill")
    p.add_argument("--rebalance-items", type=int, default=100_000,
                   help="distinct keys seeded before the rebalance (each moved copy streams its share)")
    p.add_argument("--idle-seconds", type=float, default=5.0,
                   help="after the rebalance: seconds the idle cluster's etcd requests are counted")
    p.add_argument("--probe-hot-ms", type=float, default=5.0,
                   help="rebalance probes: ms between a partition's writes while its handover is under way")
    p.add_argument("--probe-cold-ms", type=float, default=200.0,
                   help="rebalance probes: ms between a partition's writes otherwise (0: closed-loop probes, "
                        "each write sent when the last was answered)")
    p.add_argument("--rebalance-timeout", type=float, default=300.0, help="seconds the rebalance may take")
    p.add_argument("--gap-write-ms", type=float, default=10.0,
                   help="the gap figure's writer: one write per partition every this many ms")
    p.add_argument("--gap-warmup", type=float, default=4.0, help="seconds of writes and tailing before the kill")
    p.add_argument("--gap-seconds", type=float, default=8.0,
                   help="seconds measured after the kill (past the lease TTL and the failover)")
    p.add_argument("--only", type=lambda v: v.split(","), default=list(DEFAULT_FIGURES),
                   help=f"comma-separated subset of {','.join(FIGURES)}")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (node logs, data dirs)")
    p.add_argument("--json", type=Path, help="also write the figures (and the PIDs of every process started) here")
    if "--quick" in (sys.argv[1:] if argv is None else argv):  # smaller defaults; explicit flags still win
        p.set_defaults(rounds=2, partitions=16, seed_items=200, lag_seconds=2.0, lag_drain=10.0, ingest_seconds=1.0,
                       ingest_rounds=1, warmup=0.5, clients=1, concurrency=2, batch=200,
                       consume_items=20_000, rebalance_items=5000)
    args = p.parse_args(argv)
    if not args.only or set(args.only) - set(FIGURES):
        p.error(f"--only takes a comma-separated subset of {','.join(FIGURES)}")
    # Ctrl-C even when started where SIGINT is ignored (a background job); SIGTERM stops every
    # process at once, since the event loop may be inside a task that swallows cancellation
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (stop_everything(), sys.exit(143)))
    started, load = time.monotonic(), os.getloadavg()[0]
    figures = run(args)
    print(f"{os.cpu_count()} cores, load average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end, "
          f"{time.monotonic() - started:.0f} s in all\n")
    print(table(figures))
    if args.json:
        args.json.write_text(json.dumps({"figures": [dataclasses.asdict(f) for f in figures],
                                         "processes": [{"pid": pid, "name": name} for pid, name in SPAWNED]},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
