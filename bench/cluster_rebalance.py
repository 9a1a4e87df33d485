"""Rebalance figures for ``bench.bench_cluster --only rebalance``: how fast a rebalance moves data
next to a plain backfill, and how long each moved partition cannot take writes.

One cluster of two nodes, one replica per partition, seeded with ``--rebalance-items`` distinct
keys (so a partition's seqno is its item count).  Then, in the same run:

1. **Single-node backfill rate**: a ``clients.Consumer`` on the first node alone streams, from
   the beginning, the partitions it is active for, up to their high seqnos: items / second.
2. **Rebalance**: a third node starts on an empty data dir and ``POST /cluster/rebalance``
   (``add``) gives it its share.  ``GET /cluster/rebalance`` is polled every 50 ms: each new
   copy is seen building, then in sync with its seqno; the seqnos of those copies over the time
   at least one was building (the union of their intervals) is the **move rate**, printed as a
   ratio of the backfill rate (50 ms polls bound its resolution; a copy built between two polls
   is not counted).
3. **Write unavailability per partition during its handover**: while the rebalance runs, one
   probe per partition writes (``PUT``, ``memory``) to the node the newest map names, paced
   (``--probe-cold-ms`` apart, ``--probe-hot-ms`` while the partition's handover record stands:
   ``bench.rebalance_probes``; ``--probe-cold-ms 0``: again as soon as the last answer came
   back), routed as ``clients.http`` routes a document request
   (``clients.redirects.DocumentRoute``: a 421 is followed to the node it names, a 503
   partition-not-active is retried after the route's backoff; the map is read again only when
   a route ends without an accepted write).  For each partition whose active moved: from its first refused write
   (from when it was sent: a source may hold a write until its handover settles) to the next
   accepted one (0 when no write was refused).  p50 / p99 / max.  The probes run in a process
   of their own with a bare keep-alive client (``bench.rebalance_probes``), stamped on the
   host's monotonic clock, and are timed for ``QUIET_S`` before the rebalance too (nothing
   moving): the baseline their latency during it is read against.
4. **Where the pause goes**: each handover's phases (``bench.cluster_phases``), and etcd's own
   request counts during the rebalance and per second on the idle cluster after it.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
import httpx

from bench import proc_cpu
from bench.cluster_figures import Figure, summary_ms, verdict
from bench.cluster_phases import (
    HandoverMarks,
    PhaseWatch,
    SwitchStamps,
    etcd_counts,
    fence_steps,
    loop_stalls,
    phase_rows,
    stall_rows,
    step_rows,
    switch_rows,
    switch_traces,
)
from bench.cluster_procs import BenchCluster, Node, partition_of, progress
from bench.suite.procs import ProcessGroup, free_port

__all__ = ["RebalanceRun", "measure_rebalance", "rebalance_figures"]


@dataclass
class RebalanceRun:
    items: int
    backfill_items: int
    backfill_s: float
    transferred: int
    transfer_s: float
    rebalance_s: float
    moved: int
    #: partition -> seconds from its first refused write to the next accepted one
    pauses: dict[int, float] = field(default_factory=dict)
    refused: int = 0
    #: partition -> status -> refused answers its probe got (see ``_Probes.answers``)
    answers: dict[int, dict[int, int]] = field(default_factory=dict)
    #: partition -> the marks of its handover (``bench.cluster_phases``)
    marks: dict[int, HandoverMarks] = field(default_factory=dict)
    moved_partitions: list[int] = field(default_factory=list)
    #: etcd requests served during the rebalance, and per second on the idle cluster after it
    etcd_during: dict[str, float] = field(default_factory=dict)
    etcd_idle_per_s: dict[str, float] = field(default_factory=dict)
    #: seconds from send to answer of every accepted probe write while the rebalance ran: the
    #: baseline the hop to a new active ("accepted write sent -> answered") is read against
    accepted_s: list[float] = field(default_factory=list)
    #: the same probes' accepted writes for ``QUIET_S`` before the rebalance starts
    quiet_s: list[float] = field(default_factory=list)
    #: window -> (probe requests sent in it, its seconds): the load the measurement adds
    probe_rate: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: how the probes were paced: "closed loop" or "hot X ms / cold Y ms"
    probe_pace: str = ""
    #: the probe process's own event-loop lag samples, before and during the rebalance
    quiet_loop_lag_s: list[float] = field(default_factory=list)
    probe_loop_lag_s: list[float] = field(default_factory=list)
    #: window -> (CPU seconds by role, wall seconds): before the rebalance (quiet) and during it
    cpu: dict[str, tuple[dict[str, float], float]] = field(default_factory=dict)
    #: node -> its lock-hold figures over the rebalance (``engine.lock_holds``, ``_holds``)
    holds: dict[str, dict[str, float]] = field(default_factory=dict)
    #: step -> milliseconds of it in each fence and takeover, from the nodes' logs (``fence_steps``)
    steps: dict[str, list[float]] = field(default_factory=dict)
    #: every switch transaction's stamps (``app.cluster.switch_trace``): (committed, step -> ms, line)
    switch_traces: list[SwitchStamps] = field(default_factory=list)
    #: node -> its loop stalls over 50 ms (``UPR_SWITCH_TRACE``), monotonic (start, end)
    stalls: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: etcd's own "took too long" warnings over the run
    etcd_slow: list[str] = field(default_factory=list)


#: seconds the probes are timed before the rebalance starts (the baseline with nothing moving)
QUIET_S = 3.0

#: debug figures the nodes count (``engine.lock_holds``), read from ``/metrics``
HOLD_PREFIXES = ("hold_", "wait_", "flush_turn_handovers")


async def _holds(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """A node's lock-hold figures, by their ``engine_stats`` names, and its PUT route's own time
    as its middleware measured it."""
    out: dict[str, float] = {}
    r = await client.get(f"{url}/metrics")
    for line in r.text.splitlines():
        if not line.startswith("upr_engine_") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.endswith("_created"):
            continue
        key = name.removeprefix("upr_engine_")
        if key.startswith(HOLD_PREFIXES):
            out[key.removesuffix("_total")] = float(value)
    for line in r.text.splitlines():
        if line.startswith("upr_http_request_duration_seconds") and 'method="PUT"' in line and "/docs/" in line:
            name, value = line.rsplit(" ", 1)
            if "_bucket" in name:
                le = name.split('le="', 1)[1].split('"', 1)[0]
                out[f"put_le_{le}"] = out.get(f"put_le_{le}", 0.0) + float(value)
            elif name.startswith("upr_http_request_duration_seconds_sum"):
                out["put_seconds"] = out.get("put_seconds", 0.0) + float(value)
            elif name.startswith("upr_http_request_duration_seconds_count"):
                out["put_count"] = out.get("put_count", 0.0) + float(value)
    return out


def _seed(cluster: BenchCluster, items: int, partitions: int, batch: int = 1000) -> None:
    actives = cluster.actives()
    with httpx.Client(timeout=60) as client:
        by_node: dict[str, list[dict[str, str]]] = {}
        for i in range(items):
            key = f"seed-{i}"
            by_node.setdefault(actives[partition_of(key, partitions)], []).append(
                {"op": "set", "key": key, "value": f"value-{i:08d}" * 8})
        for url, ops in by_node.items():
            for start in range(0, len(ops), batch):
                r = client.post(f"{url}/docs/_bulk", json=ops[start:start + batch], params={"durability": "memory"})
                r.raise_for_status()


async def _backfill(url: str, partitions: list[int], highs: dict[int, int], state: Path) -> tuple[int, float]:
    from clients import Consumer, Mutation

    count, done = 0, set()
    started = time.monotonic()
    async with Consumer(url, partitions=partitions, start="beginning", state=state, name="bench-backfill") as consumer:
        async for event in consumer:
            if isinstance(event, Mutation):
                count += 1
                if event.seqno >= highs[event.partition]:
                    done.add(event.partition)
                    if len(done) == len(partitions):
                        break
    return count, time.monotonic() - started


class _ProbeProcess:
    """The probes' process (``bench.rebalance_probes``): started, told to stop, read back."""

    def __init__(self, urls: list[str], partitions: int, etcd: str, prefix: str, hot_ms: float,
                 cold_ms: float) -> None:
        self.urls, self.partitions = urls, partitions
        #: the pace (``bench.rebalance_probes.Pace``); a cold interval of 0: closed-loop probes
        self.pace = [etcd, prefix, f"{hot_ms:g}", f"{cold_ms:g}"] if cold_ms > 0 else []
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.rebalance_probes", ",".join(self.urls), str(self.partitions), *self.pace,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 30)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"the probe process did not start: {line!r}")

    async def finish(self) -> dict[str, list[list[float]]]:
        """Stop the probes; every answer ``[partition, status, sent, answered]`` and loop-lag sample."""
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"stop\n")
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        await self.proc.wait()
        return json.loads(line)  # type: ignore[no-any-return]


@dataclass
class _ProbeFigures:
    """What the probes' answers say, read on the bench's clock (the pause's definition is
    unchanged: per partition, from the first refused write's send to the next accepted answer)."""

    pauses: dict[int, float] = field(default_factory=dict)
    refused: int = 0
    answers: dict[int, dict[int, int]] = field(default_factory=dict)


def _read_answers(answers: list[list[float]], phases: PhaseWatch) -> _ProbeFigures:
    """Pauses and refusal counts from the answers, in the order they came back, and the probe's
    marks fed to ``phases`` (a refusal counts for a handover only once its record was seen)."""
    out = _ProbeFigures()
    first_refused: dict[int, float] = {}
    for p_, status_, sent, answered in answers:
        p, status = int(p_), int(status_)
        if status in (200, 201):
            if p in first_refused:
                out.pauses[p] = max(out.pauses.get(p, 0.0), answered - first_refused.pop(p))
                phases.probe_accepted(p, answered, sent)
            continue
        out.refused += 1
        counts = out.answers.setdefault(p, {})
        counts[status] = counts.get(status, 0) + 1
        # from when the refused write was sent: a node may hold it a while before answering
        first_refused.setdefault(p, sent)
        marks = phases.marks.get(p)
        if marks is not None and marks.created is not None and marks.created <= answered:
            phases.probe_refused(p, status, sent, answered)
    return out


def _accepted_within(answers: list[list[float]], start: float, end: float) -> list[float]:
    """Send-to-answer seconds of the accepted writes sent between ``start`` and ``end``."""
    return [answered - sent for _p, status, sent, answered in answers
            if int(status) in (200, 201) and start <= sent <= end]


def _sent_within(answers: list[list[float]], start: float, end: float) -> int:
    """Probe requests (accepted or not) sent between ``start`` and ``end``."""
    return sum(1 for _p, _status, sent, _answered in answers if start <= sent <= end)


def _lag_within(samples: list[list[float]], start: float, end: float) -> list[float]:
    return [lag for when, lag in samples if start <= when <= end]


async def _rebalance(cluster: BenchCluster, new: Node, args: argparse.Namespace) -> RebalanceRun:
    base = cluster.nodes[next(iter(cluster.nodes))].url
    before = {e["partition"]: e["active"] for e in cluster.view()["map"]["partitions"]}
    phases = PhaseWatch(cluster.etcd_url, f"/upr/bench/{cluster.name}")
    ready = asyncio.Event()
    phase_task = asyncio.create_task(phases.run(ready))
    await asyncio.wait_for(ready.wait(), 30)
    probes = _ProbeProcess([n.url for n in cluster.live()], args.partitions, cluster.etcd_url,
                           f"/upr/bench/{cluster.name}", args.probe_hot_ms, args.probe_cold_ms)
    await probes.start()
    await asyncio.sleep(0.5)
    # the same probes on the same cluster with nothing moving: the baseline of their latency
    cpu_from, quiet_from = proc_cpu.snapshot(), time.monotonic()
    await asyncio.sleep(QUIET_S)
    quiet_to = time.monotonic()
    quiet_cpu = (proc_cpu.spent(cpu_from, proc_cpu.snapshot()), quiet_to - quiet_from)
    #: (partition, node) of each new copy -> [first seen building, first seen in sync, its seqno then]
    copies: dict[tuple[int, str], list] = {}
    async with httpx.AsyncClient(timeout=10) as client:
        counts_before = await etcd_counts(client, cluster.etcd_url)
        holds_before = {n.name: await _holds(client, n.url) for n in cluster.live()}
        cpu_from = proc_cpu.snapshot()
        started = time.monotonic()
        r = await client.post(f"{base}/cluster/rebalance", json={"add": [new.name]})
        r.raise_for_status()
        run = r.json()["request"]["id"]
        deadline = started + args.rebalance_timeout
        while True:
            status = (await client.get(f"{base}/cluster/rebalance")).json()
            now = time.monotonic()
            for copy in status["building"]:
                c = copies.setdefault((copy["partition"], copy["node"]), [now, None, 0])
                if copy["in_sync"] and c[1] is None:
                    c[1], c[2] = now, copy["seqno"] or 0
            request = status["request"]
            if request is None or request["id"] != run:
                break
            if request["refused"]:
                raise RuntimeError(f"rebalance refused: {request['refused']}")
            if time.monotonic() > deadline:
                raise RuntimeError("the rebalance did not finish in time")
            await asyncio.sleep(0.05)
        ended = time.monotonic()
        busy_cpu = (proc_cpu.spent(cpu_from, proc_cpu.snapshot()), ended - started)
        counts_after = await etcd_counts(client, cluster.etcd_url)
        holds: dict[str, dict[str, float]] = {}
        for name, before_figures in holds_before.items():
            after_figures = await _holds(client, cluster.nodes[name].url)
            holds[name] = {k: v if k.endswith("max_seconds") else v - before_figures.get(k, 0.0)
                           for k, v in after_figures.items()}
        await asyncio.sleep(0.5)
        probed = await probes.finish()
        phase_task.cancel()
        await asyncio.gather(phase_task, return_exceptions=True)
        # the idle cluster's own traffic to etcd (no writes, no moves): what every tick costs
        await asyncio.sleep(2.0)
        idle_from, idle_start = await etcd_counts(client, cluster.etcd_url), time.monotonic()
        await asyncio.sleep(args.idle_seconds)
        idle_to, idle_s = await etcd_counts(client, cluster.etcd_url), time.monotonic() - idle_start
    answers, loop_lag = probed["answers"], probed["loop_lag"]
    seen = _read_answers(answers, phases)
    after = {e["partition"]: e["active"] for e in cluster.view()["map"]["partitions"]}
    moved = [p for p in before if before[p] != after[p]]
    # the move rate: the items of the copies seen from building to in sync, over the time at
    # least one of them was building (the union of their intervals)
    spans = sorted((c[0], c[1]) for c in copies.values() if c[1] is not None)
    busy, reach = 0.0, float("-inf")
    for a, b in spans:
        busy += max(0.0, b - max(a, reach))
        reach = max(reach, b)
    return RebalanceRun(items=args.rebalance_items, backfill_items=0, backfill_s=0.0,
                        transferred=sum(int(c[2]) for c in copies.values() if c[1] is not None),
                        transfer_s=busy if spans else float("nan"), rebalance_s=ended - started, moved=len(moved),
                        pauses={p: seen.pauses.get(p, 0.0) for p in moved}, refused=seen.refused,
                        answers={p: seen.answers.get(p, {}) for p in moved},
                        marks=phases.marks, moved_partitions=moved,
                        etcd_during={k: counts_after[k] - counts_before.get(k, 0) for k in counts_after},
                        etcd_idle_per_s={k: (idle_to[k] - idle_from.get(k, 0)) / idle_s for k in idle_to},
                        accepted_s=_accepted_within(answers, started, ended),
                        quiet_s=_accepted_within(answers, quiet_from, quiet_to),
                        quiet_loop_lag_s=_lag_within(loop_lag, quiet_from, quiet_to),
                        probe_loop_lag_s=_lag_within(loop_lag, started, ended),
                        cpu={"before the rebalance": quiet_cpu, "during the rebalance": busy_cpu}, holds=holds,
                        probe_rate={"before the rebalance": (_sent_within(answers, quiet_from, quiet_to),
                                                             quiet_to - quiet_from),
                                    "during the rebalance": (_sent_within(answers, started, ended), ended - started)},
                        probe_pace=(f"hot {args.probe_hot_ms:g} ms / cold {args.probe_cold_ms:g} ms"
                                    if args.probe_cold_ms > 0 else "closed loop"))


def measure_rebalance(group: ProcessGroup, work: Path, etcd: str, args: argparse.Namespace) -> RebalanceRun:
    cluster = BenchCluster(group, work, etcd, "rb", args.partitions, replicas=1, size=2,
                           lease_ttl_s=args.lease_ttl, env={"UPR_LOCK_HOLDS": "1", "UPR_SWITCH_TRACE": "1"}).start()
    try:
        progress(f"rebalance: seeding {args.rebalance_items:,} items over {args.partitions} partitions")
        _seed(cluster, args.rebalance_items, args.partitions)
        cluster.wait_until(cluster.placed_and_followed, 120, "replicas in sync after seeding")
        first = next(iter(cluster.nodes.values()))
        view = cluster.view()
        mine = [e["partition"] for e in view["map"]["partitions"] if e["active"] == first.name]
        highs = {p: httpx.get(f"{first.url}/partitions/{p}", timeout=10).json()["high_seqno"] for p in mine}
        progress(f"rebalance: backfill of {sum(highs.values()):,} items from {first.name} alone")
        count, seconds = asyncio.run(_backfill(first.url, mine, highs, work / "rb-backfill-state"))
        progress(f"rebalance: backfill {count / seconds:,.0f} items/s; starting a third node, empty, and adding it")
        new = Node(f"rb{len(cluster.nodes) + 1}", free_port(), work / "rb" / "new" / "data")
        cluster.nodes[new.name] = new
        cluster._spawn(new)
        cluster._ready(new, 90)
        cluster.wait_until(lambda: any(n["name"] == new.name and n["state"] == "up" for n in cluster.view()["nodes"]),
                           60, "the new node up")
        run = asyncio.run(_rebalance(cluster, new, args))
        run.backfill_items, run.backfill_s = count, seconds
        lines: list[str] = []
        for log_file in sorted((work / "rb").glob("*/server.log")):
            node_lines = log_file.read_text(errors="replace").splitlines()
            lines.extend(node_lines)
            name = new.name if log_file.parent.name == "new" else log_file.parent.name
            run.stalls[name] = loop_stalls(node_lines)
        run.steps = fence_steps(lines)
        run.switch_traces = switch_traces(lines)
        etcd_log = work / "etcd.log"
        run.etcd_slow = [line for line in etcd_log.read_text(errors="replace").splitlines()
                         if "took too long" in line] if etcd_log.exists() else []
        samples = collections.Counter(line.split("loop stall sample: ", 1)[1][:400] for line in lines
                                      if "loop stall sample: " in line)
        for stack, n in samples.most_common(12):
            progress(f"loop stall sample x{n}: {stack}")
        for trace in run.switch_traces:
            progress(f"switch trace: {trace.line}")
        for line in run.etcd_slow:
            progress(f"etcd: {line[:400]}")
        progress(f"rebalance: {run.moved} active(s) moved, {run.transferred:,} items transferred in "
                 f"{run.rebalance_s:.1f} s")
        return run
    finally:
        cluster.stop()


def rebalance_figures(run: RebalanceRun, args: argparse.Namespace) -> list[Figure]:
    backfill = run.backfill_items / run.backfill_s if run.backfill_s > 0 else float("nan")
    moving = run.transferred / run.transfer_s if run.transfer_s and run.transfer_s > 0 else float("nan")
    ratio = moving / backfill if backfill == backfill and backfill > 0 else float("nan")
    pauses = sorted(run.pauses.values())
    s = summary_ms(pauses) if pauses else {"p50": float("nan"), "p99": float("nan"), "p100": float("nan")}
    return [
        Figure("rebalance move rate / single-node backfill rate", f"{ratio:.2f} ({moving:,.0f} vs {backfill:,.0f} items/s)",
               "—", "—",
               f"{run.transferred:,} seqnos to the new copies over {run.transfer_s:.1f} s while copies were building "
               f"({run.rebalance_s:.1f} s for the whole rebalance); backfill: a Consumer on one node, "
               f"{run.backfill_items:,} items in {run.backfill_s:.1f} s"),
        Figure("write unavailability per moved partition (handover)",
               f"p50 {s['p50']:.0f} ms, p99 {s['p99']:.0f} ms, max {s['p100']:.0f} ms over {len(pauses)} partition(s)",
               "p99 < 200 ms", verdict(s["p99"], 200, higher_is_better=False),
               f"first refused write to the next accepted one, per partition whose active moved "
               f"({run.refused} refusals in all; probes route as clients.http: 421 followed, 503 retried "
               f"after DocumentRoute's backoff)"),
        Figure("refused answers per moved partition (probe)", _answers(run), "—", "—",
               "421s followed and 503s retried by each moved partition's probe over the whole run: hops, "
               "independent of the machine's load"),
        *(Figure(f"handover phase: {label}", result, "—", "—")
          for label, result in phase_rows(run.marks, run.moved_partitions)),
        *(Figure(f"fence step: {label}", result, "—", "—",
                 "from the nodes' log lines (host monotonic clock, each node's own): source: catch-up (writes "
                 "still taken), stop, ack (the target's acknowledgement of the last items), switch (the etcd "
                 "transaction, sent -> answered); target: the map's arrival -> its takeover")
          for label, result in step_rows(run.steps)),
        *(Figure(f"switch transaction: {label}", result, "—", "—",
                 "UPR_SWITCH_TRACE: the source's etcd client's steps (handed -> connection acquired -> "
                 "request written -> answer's headers read -> body read -> fence resumed) and what of the "
                 "node overlapped the whole transaction (loop stalls over 5 ms, GC collections)")
          for label, result in switch_rows(run.switch_traces)),
        *(Figure(f"loop stalls over 50 ms, {label}", result, "—", "—")
          for label, result in stall_rows(run.marks, run.moved_partitions, run.stalls)),
        Figure("etcd's own slow-request warnings during the run", f"{len(run.etcd_slow)}", "—", "—",
               "etcd's log (threshold: --experimental-warning-apply-duration, 100 ms unless "
               "UPR_BENCH_ETCD_ARGS sets it)"),
        Figure("any accepted probe write during the rebalance: sent -> answered", _latency(run.accepted_s), "—", "—",
               "every partition's probe, moving or not: the baseline for 'accepted write sent -> answered' "
               "(the first write a new active answers)"),
        Figure("any accepted probe write, same probes before the rebalance: sent -> answered", _latency(run.quiet_s),
               "—", "—", f"the {QUIET_S:.0f} s before the rebalance starts, nothing moving: the probes' own baseline"),
        *(Figure(f"probe requests per second {window}", f"{n / wall:,.0f}/s ({n:,} in {wall:.1f} s; {run.probe_pace})",
                 "—", "—", "the load the measurement itself puts on the nodes: every write a probe sent, "
                 "accepted or refused")
          for window, (n, wall) in run.probe_rate.items()),
        Figure("the probe process's own event-loop lag before the rebalance", _lag(run.quiet_loop_lag_s), "—", "—"),
        Figure("the probe process's own event-loop lag during the rebalance", _lag(run.probe_loop_lag_s), "—", "—",
               "a 10 ms sleep's overshoot in the probes' process: the client's share of 'sent -> answered'"),
        *(Figure(f"CPU {window}", ", ".join(f"{role} {sec / wall:.2f}" for role, sec in by_role.items())
                 + f" cores over {wall:.1f} s", "—", "—",
                 "CPU seconds per wall second by process role (/proc)")
          for window, (by_role, wall) in run.cpu.items()),
        *hold_figures(run),
        Figure("etcd requests during the rebalance",
               f"{run.etcd_during.get('range', 0):,.0f} ranges, {run.etcd_during.get('txn', 0):,.0f} txns, "
               f"{run.etcd_during.get('put', 0):,.0f} puts", "—", "—",
               "etcd's own counters (/metrics), load-independent; the bench's own watch and polls add a few"),
        Figure("etcd requests per second, idle 3-node cluster after it",
               f"{run.etcd_idle_per_s.get('range', 0):.1f} ranges/s, {run.etcd_idle_per_s.get('txn', 0):.1f} txns/s, "
               f"{run.etcd_idle_per_s.get('put', 0):.1f} puts/s", "—", "—",
               f"over {args.idle_seconds:.0f} s with no writes and nothing moving (lease keep-alives are not counted)"),
    ]


def hold_figures(run: RebalanceRun) -> list[Figure]:
    """Per node, over the rebalance: how long each holder kept the writer lock and the LMDB
    turn and how long the others waited for them (``engine.lock_holds``), how often a flush
    round handed the turn over, and the PUT route's own time.  Counts of long holds do not
    depend on the machine's load the way latencies do."""
    rows = []
    for node, f in sorted(run.holds.items()):
        parts = []
        for name in ("hold_lmdb_turn_flusher", "hold_lmdb_turn_writer", "hold_lmdb_turn_worker", "hold_lmdb_turn_loop",
                     "hold_lmdb_turn_other", "hold_writer_lock_writer", "hold_writer_lock_worker",
                     "hold_writer_lock_loop", "hold_writer_lock_flusher", "hold_writer_lock_other",
                     "wait_lmdb_turn_writer", "wait_writer_lock_writer", "wait_lmdb_turn_flusher",
                     "wait_writer_lock_worker"):
            n = f.get(f"{name}_count", 0.0)
            if not n:
                continue
            parts.append(f"{name}: {n:,.0f}, mean {f.get(f'{name}_seconds', 0.0) / n * 1000:.2f} ms, "
                         f"max {f.get(f'{name}_max_seconds', 0.0) * 1000:.0f} ms, "
                         f">5/20/100 ms {f.get(f'{name}_over_5ms_count', 0):.0f}/"
                         f"{f.get(f'{name}_over_20ms_count', 0):.0f}/{f.get(f'{name}_over_100ms_count', 0):.0f}")
        parts.append(f"flush rounds' turn handovers {f.get('flush_turn_handovers', 0.0):,.0f}")
        n = f.get("put_count", 0.0)
        if n:
            within = {float(k.removeprefix("put_le_")): v for k, v in f.items() if k.startswith("put_le_")}
            p50 = min((le for le, c in within.items() if c >= 0.5 * n), default=float("inf"))
            p99 = min((le for le, c in within.items() if c >= 0.99 * n), default=float("inf"))
            parts.append(f"PUT route's own time (middleware): {n:,.0f}, mean {f.get('put_seconds', 0.0) / n * 1000:.1f} ms, "
                         f"p50 <= {p50 * 1000:g} ms, p99 <= {p99 * 1000:g} ms")
        rows.append(Figure(f"lock holds during the rebalance, node {node}", "; ".join(parts), "—", "—",
                           "engine.lock_holds (UPR_LOCK_HOLDS=1): maxima over the node's life, counts over the rebalance"))
    return rows


def _lag(values: list[float]) -> str:
    if not values:
        return "none"
    s = summary_ms(sorted(values))
    return f"p50 {s['p50']:.1f} ms, p99 {s['p99']:.0f} ms, max {s['p100']:.0f} ms over {len(values):,} samples"


def _latency(values: list[float]) -> str:
    if not values:
        return "none"
    s = summary_ms(sorted(values))
    return f"p50 {s['p50']:.0f} ms, p99 {s['p99']:.0f} ms, max {s['p100']:.0f} ms over {len(values):,} writes"


def _answers(run: RebalanceRun) -> str:
    moved = run.moved_partitions or list(run.answers)
    n = max(len(moved), 1)
    statuses = sorted({status for p in moved for status in run.answers.get(p, {})})
    parts = [f"{status}: {sum(run.answers.get(p, {}).get(status, 0) for p in moved) / n:.1f}" for status in statuses]
    return (", ".join(parts) or "none") + f" (mean over {len(moved)})"
