"""The healthy-partition gap for ``bench.bench_cluster --only gap``: while one node of three is
SIGKILLed, how long do the partitions it was not active for go without a delivery?

Three nodes, one replica per partition.  A writer process keeps writing one key of every
partition every ``--gap-write-ms`` (one ``memory`` bulk per node per round, each node on a task
of its own so a dead node's refused connection never holds back the others; a 421 or a refused
bulk makes that task read the map again), and one ``clients.Consumer`` given all three URLs, in
the bench's process, tails every partition.  ``--gap-warmup`` seconds after every partition
has delivered, the node active for the most partitions is SIGKILLed, and the run goes on
``--gap-seconds`` more (past the lease TTL and the failover).

Printed, over the partitions whose active was *not* killed (the healthy ones), from the kill to
the end: the longest gap between two deliveries of a partition (p50 and max over those
partitions; the goal is a max under 100 ms), beside the same figure over an equally long window
before the kill (what the write interval and the machine's scheduling cost without a fault), the
writer's own longest gap between acknowledged writes of those partitions (a delivery gap cannot
be shorter than the writes'), and the acknowledgement-to-delivery latency after the kill.  Over
the moved partitions: how many delivered a write their new active acknowledged, and how long after
the kill the first such delivery came (the consumer's log, with times, is ``gap-consumer.log`` in
the run's directory with ``--keep``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.cluster_figures import Figure, summary_ms, verdict
from bench.cluster_procs import ROOT, BenchCluster, key_in_partition, progress
from bench.suite.procs import ProcessGroup

__all__ = ["GapRun", "measure_gap", "gap_figures", "longest_gap", "first_new_delivery"]


@dataclass
class GapRun:
    healthy: list[int]
    moved: list[int]
    #: partition -> longest delivery gap after the kill / in the window before it (seconds)
    after: dict[int, float] = field(default_factory=dict)
    before: dict[int, float] = field(default_factory=dict)
    writer_after: dict[int, float] = field(default_factory=dict)
    latency: list[float] = field(default_factory=list)
    writes: int = 0
    moved_resumed: int = 0
    #: moved partition -> seconds from the kill to its first delivery of a write its new active acknowledged
    resumed_after: dict[int, float] = field(default_factory=dict)


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest interval between ``start``, the times inside (start, end) and ``end``."""
    inside = [start] + [t for t in times if start < t < end] + [end]
    return max(b - a for a, b in zip(inside, inside[1:]))


#: a write acknowledged this long after the SIGKILL was acknowledged by a new active (a failover
#: takes a lease expiry, a second and more); earlier ones may be the dead node's last answers
NEW_ACTIVE_AFTER_S = 0.25
#: a delivery this much ahead of the writer's reading of its acknowledgement is still that write
#: (two processes: the consumer may see it before the writer's loop reads the answer)
ACK_READ_SLACK_S = 0.05


def first_new_delivery(deliveries: list[tuple[float, int]], acked: dict[int, float], killed_at: float) -> float | None:
    """When a moved partition first delivered a write its new active acknowledged: the time of
    the first of ``deliveries`` ((time, seqno)) whose seqno ``acked`` (seqno -> ack time, the
    latest ack of that seqno) says was acknowledged ``NEW_ACTIVE_AFTER_S`` after ``killed_at``.
    The dead node's last frames, still in the socket at the kill, do not count; nor does a seqno
    the dead node had delivered before its new active acknowledged the same seqno on its branch."""
    for t, seqno in deliveries:
        acked_at = acked.get(seqno)
        if acked_at is not None and acked_at > killed_at + NEW_ACTIVE_AFTER_S and t >= acked_at - ACK_READ_SLACK_S:
            return t
    return None


class _Writer:
    """Runs in a process of its own (``python -m bench.cluster_gap URLS ...``), so that its pace
    does not depend on the consumer's decoding in the bench's process; ``time.monotonic`` is the
    system-wide monotonic clock on Linux, so its times compare with the bench's."""

    def __init__(self, urls: list[str], partitions: int, interval_s: float) -> None:
        self.urls, self.partitions, self.interval_s = urls, partitions, interval_s
        self.keys = {p: key_in_partition(p, partitions, "gap") for p in range(partitions)}
        self.stop = asyncio.Event()
        self.actives: dict[int, str] = {}
        self.node_urls: set[str] = set()
        self.acked_at: dict[int, list[float]] = defaultdict(list)
        self.acked_seqnos: dict[tuple[int, int], float] = {}

    async def read_map(self, client: httpx.AsyncClient) -> None:
        for url in self.urls:
            try:
                view = (await client.get(f"{url}/cluster", timeout=2)).json()
            except (httpx.HTTPError, ValueError):
                continue
            names = {n["name"]: n["url"] for n in view["nodes"] if n["url"] and n["state"] == "up"}
            self.actives = {e["partition"]: names.get(e["active"], "") for e in view["map"]["partitions"]}
            self.node_urls |= {u for u in names.values() if u}
            return

    async def node_loop(self, client: httpx.AsyncClient, url: str) -> None:
        n = 0
        while not self.stop.is_set():
            mine = [p for p, u in self.actives.items() if u == url]
            if not mine:
                await asyncio.sleep(self.interval_s)
                continue
            ops = [{"op": "set", "key": self.keys[p], "value": f"r{n}"} for p in mine]
            stale = False
            try:
                r = await client.post(f"{url}/docs/_bulk", params={"durability": "memory"}, json=ops, timeout=2)
                now = time.monotonic()
                if r.status_code != 200:
                    stale = True
                else:
                    for result in r.json()["results"]:
                        if result["status"] == 200:
                            self.acked_at[result["partition"]].append(now)
                            self.acked_seqnos[(result["partition"], result["seqno"])] = now
                        else:
                            stale = True
            except (httpx.HTTPError, ValueError):
                stale = True
            if stale:
                await self.read_map(client)
            n += 1
            await asyncio.sleep(self.interval_s)

    async def map_loop(self, client: httpx.AsyncClient) -> None:
        """Reads the map again while some partition has no live active.  A node loop reads it only
        after a refused write, so a read that lands between the dead node's lease expiring and its
        partitions' promotion (the map names it, but as down) leaves those partitions on no loop:
        without this, nothing would ever write them again."""
        while not self.stop.is_set():
            if any(not u for u in self.actives.values()):
                await self.read_map(client)
            await asyncio.sleep(self.interval_s)

    async def run(self) -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=32)) as client:
            await self.read_map(client)
            await asyncio.gather(self.map_loop(client),
                                 *(self.node_loop(client, url) for url in sorted(self.node_urls)))


async def _write_until(urls: list[str], partitions: int, interval_s: float, stop: Path, out: Path) -> None:
    writer = _Writer(urls, partitions, interval_s)
    task = asyncio.create_task(writer.run())
    while not stop.exists():
        await asyncio.sleep(0.05)
    writer.stop.set()
    await task
    out.write_text(json.dumps({"acked_at": {str(p): t for p, t in writer.acked_at.items()},
                               "acked_seqnos": [[p, s, t] for (p, s), t in writer.acked_seqnos.items()]}))


def main(argv: list[str] | None = None) -> int:
    """The writer process: ``URL,URL,... PARTITIONS INTERVAL_MS STOP_FILE OUT.json``; it writes
    until ``STOP_FILE`` exists."""
    urls, partitions, interval_ms, stop, out = (argv if argv is not None else sys.argv[1:])
    asyncio.run(_write_until(urls.split(","), int(partitions), float(interval_ms) / 1000, Path(stop), Path(out)))
    return 0


async def _scenario(cluster: BenchCluster, group: ProcessGroup, work: Path, args: argparse.Namespace) -> GapRun:
    from clients import Consumer, Mutation

    urls = [n.url for n in cluster.live()]
    view = cluster.view()
    owned: dict[str, list[int]] = defaultdict(list)
    for e in view["map"]["partitions"]:
        owned[e["active"]].append(e["partition"])
    victim = max(owned, key=lambda n: len(owned[n]))
    moved = sorted(owned[victim])
    healthy = sorted(p for p in range(args.partitions) if p not in moved)
    results, stop = work / "gap-writer.json", work / "gap-writer.stop"
    writer = group.spawn([sys.executable, "-m", "bench.cluster_gap", ",".join(urls), str(args.partitions),
                          str(args.gap_write_ms), str(stop), str(results)],
                         name="gap writer", log=work / "gap-writer.log", cwd=ROOT)
    delivered: dict[int, list[float]] = defaultdict(list)
    delivered_seqnos: dict[tuple[int, int], float] = {}
    #: partition -> (time, seqno) of every delivery
    deliveries: dict[int, list[tuple[float, int]]] = defaultdict(list)
    consumer = Consumer(",".join(urls), name="bench-gap", start="now", state=work / "gap-state", open_timeout=5)
    # the consumer's own account of what it followed, with times, beside the nodes' logs
    client_log = logging.getLogger("upr.client")
    handler = logging.FileHandler(work / "gap-consumer.log")
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s %(message)s", "%H:%M:%S"))
    client_log.addHandler(handler)
    client_log.setLevel(logging.INFO)

    async def consume() -> None:
        async for event in consumer:
            if type(event) is Mutation:
                now = time.monotonic()
                delivered[event.partition].append(now)
                delivered_seqnos.setdefault((event.partition, event.seqno), now)
                deliveries[event.partition].append((now, event.seqno))

    consuming = asyncio.create_task(consume())
    try:
        deadline = time.monotonic() + 120
        while len(delivered) < args.partitions:  # the writer is up and every partition delivers
            if consuming.done():
                consuming.result()
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(delivered)} of {args.partitions} partitions delivered in 120 s")
            await asyncio.sleep(0.1)
        await asyncio.sleep(args.gap_warmup)
        progress(f"gap: SIGKILL {victim} (active for {len(moved)} of {args.partitions} partitions)")
        killed_at = await asyncio.to_thread(cluster.kill, victim)
        await asyncio.sleep(args.gap_seconds)
        stop.touch()
        await asyncio.to_thread(writer.wait, 60)
        ended = time.monotonic()
        await asyncio.sleep(0.5)  # the last writes' deliveries
    finally:
        group.stop(writer)
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
        await consumer.close()
        client_log.removeHandler(handler)
        handler.close()
    written = json.loads(results.read_text())
    acked_at = {int(p): times for p, times in written["acked_at"].items()}
    acked_seqnos = {(p, s): t for p, s, t in written["acked_seqnos"]}
    ended = min(ended, max((t for times in acked_at.values() for t in times), default=ended))
    window = ended - killed_at
    run = GapRun(healthy=healthy, moved=moved)
    for p in healthy:
        run.after[p] = longest_gap(delivered[p], killed_at, ended)
        run.before[p] = longest_gap(delivered[p], killed_at - min(window, args.gap_warmup), killed_at)
        run.writer_after[p] = longest_gap(acked_at.get(p, []), killed_at, ended)
    # a delivery seen before the writer's process read its acknowledgement counts 0 (the race is
    # below the method's resolution, as in the lag figure)
    run.latency = sorted(max(0.0, delivered_seqnos[k] - t) for k, t in acked_seqnos.items()
                         if k[0] in healthy and t > killed_at and k in delivered_seqnos)
    run.writes = sum(len(v) for v in acked_at.values())
    for p in moved:
        first = first_new_delivery(deliveries[p], {s: t for (q, s), t in acked_seqnos.items() if q == p}, killed_at)
        if first is not None:
            run.resumed_after[p] = first - killed_at
    run.moved_resumed = len(run.resumed_after)
    return run


def measure_gap(group: ProcessGroup, work: Path, etcd: str, args: argparse.Namespace) -> GapRun:
    cluster = BenchCluster(group, work, etcd, "gap", args.partitions, replicas=1, size=3,
                           lease_ttl_s=args.lease_ttl).start()
    try:
        cluster.wait_until(cluster.placed_and_followed, 120, "replicas in sync")
        return asyncio.run(_scenario(cluster, group, work, args))
    finally:
        cluster.stop()


def gap_figures(run: GapRun, args: argparse.Namespace) -> list[Figure]:
    def spread(values: dict[int, float]) -> tuple[str, float]:
        if not values:
            return "n/a", float("nan")
        s = summary_ms(sorted(values.values()), (50, 100))
        return f"p50 {s['p50']:.0f} ms, max {s['p100']:.0f} ms", s["p100"]

    after, worst = spread(run.after)
    before, _ = spread(run.before)
    writer, _ = spread(run.writer_after)
    lat: Any = summary_ms(run.latency) if run.latency else None
    resumed = ""
    if run.resumed_after:
        times = sorted(run.resumed_after.values())
        each = ", ".join(f"{p}: {t:.2f}" for p, t in sorted(run.resumed_after.items()))
        resumed = (f" (kill to the first delivery of a write the new active acknowledged: {times[0]:.2f}–{times[-1]:.2f} s;"
                   f" per partition {each} s)")
    return [
        Figure("longest delivery gap on a healthy partition while a node is SIGKILLed",
               f"{after} over {len(run.healthy)} partition(s)", "max < 100 ms",
               verdict(worst, 100, higher_is_better=False),
               f"per partition whose active was not killed, from the kill to {args.gap_seconds:.0f} s later; "
               f"before the kill, same length: {before}; the writer's own longest gap between acknowledged "
               f"writes of those partitions: {writer} (one write per partition every {args.gap_write_ms:.0f} ms); "
               f"{run.moved_resumed} of the {len(run.moved)} moved partitions delivered again from their new "
               f"actives{resumed}; {run.writes:,} writes acknowledged"),
        Figure("healthy partitions: acknowledgement to delivery after the kill",
               f"p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms, max {lat['p100']:.1f} ms" if lat else "n/a",
               "—", "—", f"over {len(run.latency):,} writes"),
    ]


if __name__ == "__main__":
    sys.exit(main())
