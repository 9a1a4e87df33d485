"""Failover time for ``bench.bench_cluster``: SIGKILL of a node to the first accepted write on each
of its partitions, written through the newest map as a cluster-aware client would.

Each round starts a fresh cluster of three nodes, one replica per partition.  Once every replica
is in sync, after a random pause (so that the kill falls anywhere in the lease's keep-alive
cycle), the node active for the most partitions is SIGKILLed.  For each of its partitions a
probe writes (``PUT``) to the node the newest map names: the map is read from every survivor's
``GET /cluster`` every ``map_poll_s`` (the method's resolution, beside one write's round trip),
and a 421 is followed at once.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.cluster_figures import Figure, summary_ms, verdict
from bench.cluster_procs import BenchCluster, key_in_partition, partition_of, progress
from bench.suite.procs import ProcessGroup


@dataclass
class FailoverRound:
    victim: str
    partitions: int
    #: per partition: seconds from SIGKILL to the first accepted write, and to the first map naming a live active
    writable: dict[int, float]
    mapped: dict[int, float]
    failed: list[int]
    #: for each partition never writable: the last thing its probe saw (what the map or a node said)
    why: dict[int, str]


async def probe_failover(cluster: BenchCluster, victim: str, keys: dict[int, str], killed_at: float,
                         map_poll_s: float, timeout: float) -> FailoverRound:
    """Write to each of ``keys``' partitions through the newest map until a write is accepted."""
    victim_url = cluster.nodes[victim].url
    survivors = [n.url for n in cluster.live()]
    newest: dict[str, Any] = {"revision": -1, "actives": {}}
    mapped: dict[int, float] = {}
    writable: dict[int, float] = {}
    why: dict[int, str] = {}
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
                    why[p] = f"map revision {newest['revision']} names no live active"
                    url = None
                    await asyncio.sleep(map_poll_s)
                    continue
                try:
                    r = await client.put(f"{url}/docs/{key}", content=b'"probe"')
                except httpx.HTTPError as exc:
                    why[p] = f"PUT to {url}: {type(exc).__name__}"
                    url = None
                    await asyncio.sleep(map_poll_s)
                    continue
                if r.status_code == 200:
                    writable[p] = time.monotonic() - killed_at
                    return
                why[p] = f"PUT to {url}: {r.status_code} {r.text[:200]}"
                try:
                    named = r.json().get("url") if r.status_code == 421 else None
                except ValueError:
                    named = None
                url = named if named and named != url and named != victim_url else None
                if url is None:
                    await asyncio.sleep(map_poll_s)

        await asyncio.gather(*(watch_map(u) for u in survivors), *(probe(p, k) for p, k in keys.items()))
    failed = sorted(set(keys) - set(writable))
    return FailoverRound(victim, len(keys), writable, mapped, failed, {p: why.get(p, "?") for p in failed})


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
    """One fresh three-node cluster per round.  WHY not one cluster killed and restarted: nothing
    moves active partitions back to a node that rejoins, so later rounds would kill a node
    holding half or all of the partitions instead of its share."""
    rnd = random.Random(args.seed)
    keys = {p: key_in_partition(p, args.partitions, "probe") for p in range(args.partitions)}
    rounds: list[FailoverRound] = []
    for r in range(args.rounds):
        cluster = BenchCluster(group, workdir, etcd, f"r{r + 1}n", args.partitions, replicas=1, size=3,
                               lease_ttl_s=args.lease_ttl).start()
        try:
            seed_data(cluster, args.seed_items, f"seed{r}")
            cluster.wait_until(cluster.placed_and_followed, 180, "every replica in sync")
            owned: dict[str, list[int]] = {}
            for entry in cluster.view()["map"]["partitions"]:
                owned.setdefault(entry["active"], []).append(entry["partition"])
            most = max(len(ps) for ps in owned.values())
            tied = sorted(n for n, ps in owned.items() if len(ps) == most)
            victim = tied[r % len(tied)]
            time.sleep(rnd.uniform(0, args.lease_ttl))
            killed_at = cluster.kill(victim)
            result = asyncio.run(probe_failover(cluster, victim, {p: keys[p] for p in owned[victim]}, killed_at,
                                                args.map_poll_ms / 1000, timeout=60))
        finally:
            cluster.stop()
        rounds.append(result)
        times = sorted(result.writable.values())
        progress(f"failover round {r + 1}/{args.rounds}: killed {victim} ({len(owned[victim])} active "
                 f"partitions): all writable after {max(times, default=float('nan')):.2f} s"
                 + "".join(f"\n  partition {p} never writable; last: {why}" for p, why in result.why.items()))
    return rounds


def failover_figure(rounds: list[FailoverRound], args: argparse.Namespace) -> Figure:
    per_partition = [t for r in rounds for t in r.writable.values()]
    mapped = [t for r in rounds for t in r.mapped.values()]
    failed = sum(len(r.failed) for r in rounds)
    if not per_partition:
        return Figure("failover time", "no partition became writable", "max ≤ 3 s", "NOT met")
    s = summary_ms(per_partition)
    worst = max(per_partition) + (float("inf") if failed else 0.0)
    whole = summary_ms([max(r.writable.values()) for r in rounds if r.writable])
    result = (f"p50 {s['p50'] / 1000:.2f} s, max {s['p100'] / 1000:.2f} s over {len(per_partition)} partitions in "
              f"{len(rounds)} rounds (every partition of the node writable: p50 {whole['p50'] / 1000:.2f} s)"
              + (f"; {failed} never writable in 60 s" if failed else ""))
    m = summary_ms(mapped) if mapped else None
    method = (f"SIGKILL to the first accepted PUT per partition of the killed node (3 nodes, {args.partitions} "
              f"partitions, 1 replica, lease TTL {args.lease_ttl} s, map polled every {args.map_poll_ms:g} ms); "
              f"a fresh cluster per round; partitions of the killed node per round "
              f"{', '.join(str(r.partitions) for r in rounds)}"
              + (f"; a live active in the map after p50 {m['p50'] / 1000:.2f} s, max {m['p100'] / 1000:.2f} s"
                 if m else ""))
    return Figure("failover time", result, f"max ≤ 3 s (TTL {args.lease_ttl} s)", verdict(worst, 3.0, False), method)
