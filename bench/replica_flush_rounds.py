"""Flush rounds a replica copy's steady stream costs, in one process: rounds, commits and the
flusher thread's CPU per received run, with and without ``engine.flusher.REPLICA_ROUND_S``.

A replicating node's flusher persists two things: this node's own ``memory`` writes (they
gather, ``GATHER_S``) and its replica copies' runs, whose acker is an eager persist listener for
replica partitions (``Engine.add_persist_listener(..., replicas_only=True)``): its active's
``persist_majority`` writes wait for the copy's rounds.  Here one engine holds replica partitions
(and, with ``--own``, active ones taking a bulk of ``memory`` writes at the same pace) and gets a
run of ``--items`` items spread over ``--visits`` partitions every ``--tick-ms``, as a replica's
applier does at 500/s in ``bench.cluster_cpu``; the persist listener counts the rounds that would hand
persisted acks to the acker (one hand-off to the event loop and one ack message each).  The modes alternate in one process: ``paced`` (``REPLICA_ROUND_S`` as
shipped) and ``prompt`` (0: a round at every interval tick while a copy has something to persist,
the previous behaviour)::

    PYTHONPATH=. python -m bench.replica_flush_rounds --seconds 10 --repeat 3

Rounds per second are set by the flusher's clock, so they hardly depend on the machine's load;
the CPU per run does (an fsync's cost is the disk's).
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from engine import flusher as flusher_module
from engine.config import EngineConfig
from engine.core.types import FailoverEntry, Item, Op, PartitionState
from engine.engine import Engine
from engine.replica import ItemsStep, MarkerStep

UUID = 77


def _thread_cpu(native_id: int) -> float:
    """CPU seconds of one thread of this process so far (``/proc/self/task``)."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(work: Path, mode: str, args: argparse.Namespace) -> dict[str, float]:
    flusher_module.REPLICA_ROUND_S = 0.0 if mode == "prompt" else args.replica_round_s
    engine = Engine.open(EngineConfig(data_dir=work / mode, partitions=args.partitions))
    woken: set[int] = set()  # the rounds that told the listener something (one acker hand-off each)
    try:
        replicas = list(range(0, args.partitions, 2))
        own = list(range(1, args.partitions, 2))
        for p in replicas:
            engine.set_state(p, PartitionState.REPLICA)
            engine.adopt_failover_log(p, (FailoverEntry(UUID, 0),))
        flusher = engine._flusher
        remove = engine.add_persist_listener(lambda p: woken.add(flusher.rounds), replicas_only=True)
        thread = flusher._thread
        assert thread.native_id is not None
        seqnos = {p: 0 for p in replicas}
        counter = 0
        tick = args.tick_ms / 1000
        rounds0, commits0, cpu0, woken0 = flusher.rounds, flusher.flushes, _thread_cpu(thread.native_id), len(woken)
        start = time.monotonic()
        runs = 0
        while (now := time.monotonic()) < start + args.seconds:
            due = start + runs * tick
            if due > now:
                time.sleep(due - now)
            steps: list[MarkerStep | ItemsStep] = []
            per_visit = max(1, args.items // args.visits)
            for _ in range(args.visits):
                p = replicas[counter % len(replicas)]
                counter += 1
                first = seqnos[p] + 1
                seqnos[p] = first + per_visit - 1
                steps.append(MarkerStep(p, first, seqnos[p]))
                steps.append(ItemsStep(p, [Item(b"r-%d-%d" % (p, s), s, 1_000_000 + s, 1, False, b"v" * 180)
                                           for s in range(first, seqnos[p] + 1)], True))
            engine.apply_replica_run(steps)
            if args.own:
                engine.write_batch([(Op.MUTATION, f"own-{runs}-{i}", b"v" * 180, None) for i in range(args.items)])
            runs += 1
        elapsed = time.monotonic() - start
        out = {"runs": runs / elapsed, "rounds": (flusher.rounds - rounds0) / elapsed,
               "commits": (flusher.flushes - commits0) / elapsed,
               "cpu_per_run_us": (_thread_cpu(thread.native_id) - cpu0) / runs * 1e6,
               "listener_wakes": (len(woken) - woken0) / elapsed}
        remove()
        return out
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tick-ms", type=float, default=10.0, help="one received run per tick")
    p.add_argument("--items", type=int, default=3, help="items per run (500/s over two nodes: 2.5 per bulk)")
    p.add_argument("--visits", type=int, default=3, help="partitions per run")
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--own", action="store_true", help="also a bulk of own memory writes per tick")
    p.add_argument("--replica-round-s", type=float, default=flusher_module.REPLICA_ROUND_S)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="upr-bench-rounds-"))
    print(f"load average {os.getloadavg()[0]:.1f}; {1000 / args.tick_ms:.0f} runs/s of {args.items} items, "
          f"own writes {'on' if args.own else 'off'}; paced = REPLICA_ROUND_S {args.replica_round_s * 1000:.0f} ms",
          flush=True)
    try:
        for i in range(args.repeat):
            for mode in ("prompt", "paced") if i % 2 == 0 else ("paced", "prompt"):
                r = run(work / str(i), mode, args)
                print(f"{mode:6s} runs {r['runs']:.0f}/s: flush rounds {r['rounds']:.1f}/s, commits {r['commits']:.1f}/s, "
                      f"flusher CPU {r['cpu_per_run_us']:.0f} µs per run, persisted-ack hand-offs "
                      f"{r['listener_wakes']:.1f}/s; load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
