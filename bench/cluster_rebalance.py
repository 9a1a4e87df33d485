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
   probe per partition writes (``PUT``, ``memory``) to the node the newest map names, again as
   soon as the last answer came back, routed as ``clients.http`` routes a document request
   (``clients.redirects.DocumentRoute``: a 421 is followed to the node it names, a 503
   partition-not-active is retried after the route's backoff; the map is read again only when
   a route ends without an accepted write).  For each partition whose active moved: from its first refused write
   (from when it was sent: a source may hold a write until its handover settles) to the next
   accepted one (0 when no write was refused).  p50 / p99 / max.
4. **Where the pause goes**: each handover's phases (``bench.cluster_phases``), and etcd's own
   request counts during the rebalance and per second on the idle cluster after it.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
import httpx

from bench.cluster_figures import Figure, summary_ms, verdict
from bench.cluster_phases import HandoverMarks, PhaseWatch, etcd_counts, phase_rows
from bench.cluster_procs import BenchCluster, Node, key_in_partition, partition_of, progress
from bench.suite.procs import ProcessGroup, free_port
from clients.redirects import DocumentRoute

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


def _json_or_none(r: httpx.Response) -> object:
    try:
        return r.json()
    except ValueError:
        return None


class _Probes:
    """One writer per partition through the newest map; notes refusals and acceptances."""

    def __init__(self, urls: list[str], partitions: int, phases: PhaseWatch | None = None) -> None:
        self.urls, self.partitions, self.phases = urls, partitions, phases
        self.stop = asyncio.Event()
        self.actives: dict[int, str] = {}
        self.first_refused: dict[int, float] = {}
        self.pauses: dict[int, float] = {}
        self.refused = 0
        #: partition -> status -> refused answers (421 redirects, 503 retries): hops per handover,
        #: a count the machine's load does not change
        self.answers: dict[int, dict[int, int]] = {}
        #: send-to-answer seconds of accepted writes, while ``timing`` is set
        self.accepted_s: list[float] = []
        self.timing = False

    async def read_map(self, client: httpx.AsyncClient) -> None:
        for url in self.urls:
            try:
                view = (await client.get(f"{url}/cluster", timeout=5)).json()
            except (httpx.HTTPError, ValueError):
                continue
            names = {n["name"]: n["url"] for n in view["nodes"] if n["url"]}
            self.actives = {e["partition"]: names.get(e["active"], "") for e in view["map"]["partitions"]}
            return

    async def probe(self, client: httpx.AsyncClient, p: int) -> None:
        key = key_in_partition(p, self.partitions, "probe")
        n = 0
        while not self.stop.is_set():
            url = self.actives.get(p)
            if not url:
                await self.read_map(client)
                await asyncio.sleep(0.01)
                continue
            # one write, hop by hop as clients.http sends it, with each answer marked
            route = DocumentRoute(url)
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    r = await client.put(f"{url}/docs/{key}", content=f"{n}".encode(), timeout=5)
                except httpx.HTTPError:
                    await self.read_map(client)
                    break
                now = time.monotonic()
                if r.status_code in (200, 201):
                    self.actives[p] = url
                    if self.timing:
                        self.accepted_s.append(now - sent)
                    if p in self.first_refused:
                        self.pauses[p] = max(self.pauses.get(p, 0.0), now - self.first_refused.pop(p))
                        if self.phases is not None:
                            self.phases.probe_accepted(p, now, sent)
                    n += 1
                    break
                self.refused += 1
                counts = self.answers.setdefault(p, {})
                counts[r.status_code] = counts.get(r.status_code, 0) + 1
                # from when the refused write was sent: a node may hold it a while before answering
                self.first_refused.setdefault(p, sent)
                if self.phases is not None:
                    self.phases.probe_refused(p, r.status_code, sent, now)
                hop = route.next(r.status_code, _json_or_none(r))
                if hop is None:  # the route gave up (or the answer named no node): read the map
                    await self.read_map(client)
                    break
                await asyncio.sleep(hop.delay)
                url = hop.url

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.partitions + 8)
        async with httpx.AsyncClient(limits=limits) as client:
            await self.read_map(client)
            await asyncio.gather(*(self.probe(client, p) for p in range(self.partitions)))


async def _rebalance(cluster: BenchCluster, new: Node, args: argparse.Namespace) -> RebalanceRun:
    base = cluster.nodes[next(iter(cluster.nodes))].url
    before = {e["partition"]: e["active"] for e in cluster.view()["map"]["partitions"]}
    phases = PhaseWatch(cluster.etcd_url, f"/upr/bench/{cluster.name}")
    ready = asyncio.Event()
    phase_task = asyncio.create_task(phases.run(ready))
    await asyncio.wait_for(ready.wait(), 30)
    probes = _Probes([n.url for n in cluster.live()], args.partitions, phases)
    probing = asyncio.create_task(probes.run())
    await asyncio.sleep(0.5)
    #: (partition, node) of each new copy -> [first seen building, first seen in sync, its seqno then]
    copies: dict[tuple[int, str], list] = {}
    async with httpx.AsyncClient(timeout=10) as client:
        counts_before = await etcd_counts(client, cluster.etcd_url)
        started = time.monotonic()
        probes.timing = True
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
        probes.timing = False
        counts_after = await etcd_counts(client, cluster.etcd_url)
        await asyncio.sleep(0.5)
        probes.stop.set()
        await probing
        phase_task.cancel()
        await asyncio.gather(phase_task, return_exceptions=True)
        # the idle cluster's own traffic to etcd (no writes, no moves): what every tick costs
        await asyncio.sleep(2.0)
        idle_from, idle_start = await etcd_counts(client, cluster.etcd_url), time.monotonic()
        await asyncio.sleep(args.idle_seconds)
        idle_to, idle_s = await etcd_counts(client, cluster.etcd_url), time.monotonic() - idle_start
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
                        pauses={p: probes.pauses.get(p, 0.0) for p in moved}, refused=probes.refused,
                        answers={p: probes.answers.get(p, {}) for p in moved},
                        marks=phases.marks, moved_partitions=moved,
                        etcd_during={k: counts_after[k] - counts_before.get(k, 0) for k in counts_after},
                        etcd_idle_per_s={k: (idle_to[k] - idle_from.get(k, 0)) / idle_s for k in idle_to},
                        accepted_s=probes.accepted_s)


def measure_rebalance(group: ProcessGroup, work: Path, etcd: str, args: argparse.Namespace) -> RebalanceRun:
    cluster = BenchCluster(group, work, etcd, "rb", args.partitions, replicas=1, size=2,
                           lease_ttl_s=args.lease_ttl).start()
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
        Figure("any accepted probe write during the rebalance: sent -> answered", _latency(run.accepted_s), "—", "—",
               "every partition's probe, moving or not: the baseline for 'accepted write sent -> answered' "
               "(the first write a new active answers)"),
        Figure("etcd requests during the rebalance",
               f"{run.etcd_during.get('range', 0):,.0f} ranges, {run.etcd_during.get('txn', 0):,.0f} txns, "
               f"{run.etcd_during.get('put', 0):,.0f} puts", "—", "—",
               "etcd's own counters (/metrics), load-independent; the bench's own watch and polls add a few"),
        Figure("etcd requests per second, idle 3-node cluster after it",
               f"{run.etcd_idle_per_s.get('range', 0):.1f} ranges/s, {run.etcd_idle_per_s.get('txn', 0):.1f} txns/s, "
               f"{run.etcd_idle_per_s.get('put', 0):.1f} puts/s", "—", "—",
               f"over {args.idle_seconds:.0f} s with no writes and nothing moving (lease keep-alives are not counted)"),
    ]


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
