"""The rebalance bench's write probes, in a process of their own: one writer per partition, each
answer stamped on the host's monotonic clock.

WHY paced, and faster where a handover is under way: sixty-four closed-loop writers (each sends
its next write the moment the last is answered) are as much load as the nodes can serve, so
their latency grew with their number (docs/benchmarks.md, Cluster: "The probes paced") and the
handover was measured on nodes the measurement itself saturated.  A probe now sends one write
every ``cold_s`` while its partition is quiet and one every ``hot_s`` (well under the 200 ms
goal) from the moment the partition's handover record appears in etcd until ``HOT_AFTER_S``
after it went, which the process learns from its own watch of the records (nothing asks the
nodes); it opens its connection to the record's target then, as a client that writes to every
node holds a connection to each, so the 421's hop costs no connect.  At most one write per
partition is in flight; a refused write is followed or retried as the route says, at once,
whatever the pace.  Without an etcd to watch (``bench.bench_cluster --probe-cold-ms 0``) the
probes are the closed loops, to compare.

WHY a process of its own and a bare client: run beside the bench's status poll and etcd watch,
with an httpx client per request, the probes' own event loop woke tens of milliseconds late on
a busy machine, and that lateness was counted as the nodes' (docs/benchmarks.md, Cluster: "Copy
builds that yield to writes").  Here each probe keeps one keep-alive connection per node
(``bench.bench_http.RawConnection``), the process runs nothing else, and it reports its own
loop lag so what is left of the client's share stays visible.

``CLOCK_MONOTONIC`` is one clock for every process of the host, so the parent compares these
stamps with its own marks (the rebalance's start and end, the handover phases from etcd).

Run by ``bench.cluster_rebalance`` as ``python -m bench.rebalance_probes URLS PARTITIONS [ETCD
PREFIX [HOT_MS COLD_MS]]`` (no etcd: closed loop): it
prints ``ready`` once it has read the map, probes until a line arrives on stdin, then prints one
JSON object: every answer as ``[partition, status, sent, answered]`` and the loop-lag samples as
``[when, lag]``.  Routing is ``clients.http``'s (``clients.redirects.DocumentRoute``): a 421 is
followed to the node it names, a 503 partition-not-active is retried after the route's backoff,
the map is read again only when a route ends without an accepted write.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench.bench_http import RawConnection
from bench.cluster_procs import key_in_partition
from clients.redirects import DocumentRoute

#: seconds a request may take before the probe drops the connection and reads the map again
REQUEST_TIMEOUT_S = 5.0

#: how often the process's own loop lag is sampled (a sleep's overshoot)
LAG_PERIOD_S = 0.01

#: seconds a partition stays hot after its handover record went (the pause's last writes are
#: retried by the route whatever the pace; this keeps the pace for the first writes after it)
HOT_AFTER_S = 1.0


@dataclass(frozen=True)
class Pace:
    """Seconds between a partition's writes (send to send): ``hot_s`` while its handover is
    under way, ``cold_s`` otherwise; both 0 for closed-loop probes."""

    hot_s: float = 0.0
    cold_s: float = 0.0

    @property
    def closed_loop(self) -> bool:
        return self.cold_s <= 0


class Probes:
    def __init__(self, urls: list[str], partitions: int, pace: Pace = Pace(),
                 etcd: tuple[str, str] | None = None) -> None:
        self.urls, self.partitions, self.pace, self.etcd = urls, partitions, pace, etcd
        #: partitions whose handover record stands, and partition -> until when it stays hot
        self.hot: set[int] = set()
        self.hot_until: dict[int, float] = {}
        #: partition -> set when it turned hot (a probe waiting its cold interval writes now)
        self.woken: dict[int, asyncio.Event] = {}
        #: partition -> the URL of its handover's target, while its record stands
        self.targets: dict[int, str] = {}
        #: node name -> URL, from the last map read
        self.node_urls: dict[str, str] = {}
        self.actives: dict[int, str] = {}
        self.stop = asyncio.Event()
        #: [partition, status, sent, answered] of every answer, in the order they came back
        self.answers: list[list[Any]] = []
        #: [when, lag seconds]
        self.loop_lag: list[list[float]] = []

    async def read_map(self) -> None:
        for url in self.urls:
            try:
                conn = await asyncio.wait_for(RawConnection.open(url), REQUEST_TIMEOUT_S)
                try:
                    status, body = await asyncio.wait_for(conn.request("GET", "/cluster"), REQUEST_TIMEOUT_S)
                finally:
                    conn.close()
                view = json.loads(body) if status == 200 else None
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                continue
            if not view:
                continue
            names = {n["name"]: n["url"] for n in view["nodes"] if n["url"]}
            self.node_urls = names
            self.actives = {e["partition"]: names.get(e["active"], "") for e in view["map"]["partitions"]}
            return

    def interval(self, p: int) -> float:
        if p in self.hot or time.monotonic() < self.hot_until.get(p, 0.0):
            return self.pace.hot_s
        return self.pace.cold_s

    async def until_due(self, p: int, last_sent: float) -> None:
        """Wait for partition ``p``'s next write: its interval after the last one was sent, or
        at once when it turns hot meanwhile."""
        if self.pace.closed_loop:
            return
        delay = last_sent + self.interval(p) - time.monotonic()
        if delay <= 0:
            return
        if delay <= self.pace.hot_s:
            await asyncio.sleep(delay)
            return
        woken = self.woken.setdefault(p, asyncio.Event())
        woken.clear()
        try:
            await asyncio.wait_for(woken.wait(), delay)
        except asyncio.TimeoutError:
            pass

    async def watch_handovers(self) -> None:
        """Keep ``hot`` as etcd's handover records say (the nodes are not asked)."""
        if self.etcd is None:
            return
        from app.cluster.etcd import EtcdClient, EtcdError

        url, prefix = self.etcd
        records = f"{prefix.rstrip('/')}/handover/partitions/".encode()
        client = EtcdClient([url])
        try:
            while not self.stop.is_set():
                try:
                    kvs, revision = await client.get_prefix(records)
                    self.hot = {int(kv.key[len(records):]) for kv in kvs}
                    for p in self.hot:
                        self.woken.setdefault(p, asyncio.Event()).set()
                    async for event in client.watch_prefix(records, revision + 1):
                        p = int(event.kv.key[len(records):])
                        if event.kind == "delete":
                            self.hot.discard(p)
                            self.targets.pop(p, None)
                            self.hot_until[p] = time.monotonic() + HOT_AFTER_S
                        else:
                            self.hot.add(p)
                            target = self.node_urls.get(json.loads(event.kv.value).get("target", ""))
                            if target:
                                self.targets[p] = target
                            self.woken.setdefault(p, asyncio.Event()).set()
                except (EtcdError, OSError, ValueError):
                    await asyncio.sleep(0.1)  # read again and watch from there
        finally:
            await client.aclose()

    async def probe(self, p: int) -> None:
        key = key_in_partition(p, self.partitions, "probe")
        conns: dict[str, RawConnection] = {}
        n = 0
        last_sent = 0.0
        try:
            while not self.stop.is_set():
                await self.until_due(p, last_sent)
                last_sent = time.monotonic()
                url = self.actives.get(p)
                if not url:
                    await self.read_map()
                    await asyncio.sleep(0.01)
                    continue
                route = DocumentRoute(url)
                target = self.targets.get(p)
                if target and target not in conns:
                    # a client that writes to several nodes keeps a connection to each (an httpx
                    # pool does): the 421's hop must not pay a connect the probe alone would
                    try:
                        conns[target] = await asyncio.wait_for(RawConnection.open(target), REQUEST_TIMEOUT_S)
                    except (OSError, asyncio.TimeoutError):
                        pass
                while not self.stop.is_set():
                    sent = time.monotonic()
                    try:
                        conn = conns.get(url)
                        if conn is None:
                            conn = conns[url] = await asyncio.wait_for(RawConnection.open(url), REQUEST_TIMEOUT_S)
                        status, body = await asyncio.wait_for(
                            conn.request("PUT", f"/docs/{key}", f"{n}".encode(), "application/octet-stream"),
                            REQUEST_TIMEOUT_S)
                    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                        dead = conns.pop(url, None)
                        if dead is not None:
                            dead.close()
                        await self.read_map()
                        break
                    answered = time.monotonic()
                    self.answers.append([p, status, sent, answered])
                    if status in (200, 201):
                        self.actives[p] = url
                        n += 1
                        break
                    try:
                        problem = json.loads(body) if body else None
                    except ValueError:
                        problem = None
                    hop = route.next(status, problem)
                    if hop is None:  # the route gave up (or the answer named no node): read the map
                        await self.read_map()
                        break
                    await asyncio.sleep(hop.delay)
                    url = hop.url
        finally:
            for conn in conns.values():
                conn.close()

    async def sample_loop_lag(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            await asyncio.sleep(LAG_PERIOD_S)
            now = time.monotonic()
            self.loop_lag.append([now, max(0.0, now - began - LAG_PERIOD_S)])

    async def run(self) -> None:
        await self.read_map()
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        stopper = loop.run_in_executor(None, sys.stdin.readline)
        tasks = [asyncio.create_task(self.probe(p)) for p in range(self.partitions)]
        tasks.append(asyncio.create_task(self.sample_loop_lag()))
        watcher = asyncio.create_task(self.watch_handovers())
        await stopper
        self.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


def main(argv: list[str]) -> None:
    urls, partitions = argv[0].split(","), int(argv[1])
    etcd = (argv[2], argv[3]) if len(argv) >= 4 else None
    pace = Pace(float(argv[4]) / 1000, float(argv[5]) / 1000) if len(argv) >= 6 and etcd else Pace()
    probes = Probes(urls, partitions, pace, etcd)
    asyncio.run(probes.run())
    sys.stdout.write(json.dumps({"answers": probes.answers, "loop_lag": probes.loop_lag}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
