"""Consumer throughput from a three-node cluster against one node with the same data.

Two clusters on the bench's etcd, without replicas: ``cons3`` (three nodes, each active for a
third of the partitions) and ``cons1`` (one node: a one-node cluster, so that only the node count
differs, as in the aggregate-ingest figure).  The same ``--consume-items`` items (keys, values of
``--consume-value-bytes``) are written to both through the map.  Then, alternately, a fresh
``clients.Consumer`` given every node's URL reads everything from the beginning "until now"
(``batches()``, the throughput path) in this process: items per second from the first item to the
end (the time to the first item, map read and handshakes, is shown apart), ``--ingest-rounds`` rounds, and the median of the per-round ratios (three nodes / one node; the goal: at least 1,
parallel connections must not make it slower).
"""
from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx

from bench.cluster_figures import Figure, median_ratio, verdict
from bench.cluster_procs import BenchCluster, partition_of, progress
from bench.suite.procs import ProcessGroup
from clients import Consumer
from engine.protocol.frames import ItemBatch


def fill(cluster: BenchCluster, items: int, value_bytes: int, partitions: int, batch: int = 1000) -> None:
    """``items`` sets, each bulk sent to its partition's active node; then wait for the flush."""
    where = cluster.actives()
    value = "v" * value_bytes
    by_url: dict[str, list[dict[str, str]]] = {}
    with httpx.Client(timeout=120) as client:
        for i in range(items):
            key = f"c{i:08d}"
            url = where[partition_of(key, partitions)]
            ops = by_url.setdefault(url, [])
            ops.append({"op": "set", "key": key, "value": value})
            if len(ops) >= batch:
                _post(client, url, ops)
                ops.clear()
        for url, ops in by_url.items():
            if ops:
                _post(client, url, ops)
    cluster.wait_until(cluster.persisted, 300, f"cluster {cluster.name} flushed")


def _post(client: httpx.Client, url: str, ops: list[dict[str, str]]) -> None:
    r = client.post(f"{url}/docs/_bulk", params={"durability": "memory"}, json=ops)
    r.raise_for_status()
    failed = r.json().get("failed", 0)
    if failed:
        raise RuntimeError(f"{url}: {failed} of {len(ops)} writes refused")


async def consume(urls: list[str]) -> tuple[int, float, float]:
    """(items, seconds from the first item to the end, seconds in all) of one consumer reading
    everything "until now" from the beginning.  The first figure is the throughput's: the map
    read and the connections' handshakes are a fixed cost, counted only in the second."""
    consumer = Consumer(urls, name="bench-consume", start="beginning", until_now=True)
    items = 0
    first: float | None = None
    try:
        t0 = time.perf_counter()
        async for x in consumer.batches():
            if type(x) is ItemBatch:
                if first is None:
                    first = time.perf_counter()
                items += len(x.seqnos)
        end = time.perf_counter()
        return items, end - (first if first is not None else t0), end - t0
    finally:
        await consumer.close()


def consume_figure(group: ProcessGroup, work: Any, etcd: str, args: argparse.Namespace) -> list[Figure]:
    clusters = {size: BenchCluster(group, work, etcd, f"cons{size}", args.partitions, replicas=0, size=size,
                                   lease_ttl_s=args.lease_ttl).start() for size in (1, 3)}
    try:
        for size, cluster in clusters.items():
            t0 = time.monotonic()
            fill(cluster, args.consume_items, args.consume_value_bytes, args.partitions)
            progress(f"consume: {args.consume_items:,} items written to {size} node(s) in {time.monotonic() - t0:.1f}s")
        rates: dict[int, list[float]] = {1: [], 3: []}
        setup: dict[int, list[float]] = {1: [], 3: []}
        for r in range(args.ingest_rounds):
            for size in (1, 3):
                urls = [n.url for n in clusters[size].live()]
                items, seconds, overall = asyncio.run(consume(urls))
                if items < args.consume_items:
                    raise RuntimeError(f"the consumer of {size} node(s) read {items} of {args.consume_items} items")
                rates[size].append(items / seconds)
                setup[size].append(overall - seconds)
            progress(f"consume round {r + 1}: one node {rates[1][-1]:,.0f} items/s, "
                     f"three nodes {rates[3][-1]:,.0f} items/s (to the first item: {setup[1][-1] * 1000:.0f} ms, "
                     f"{setup[3][-1] * 1000:.0f} ms)")
    finally:
        for cluster in clusters.values():
            cluster.stop()
    ratio, ratios = median_ratio(rates[3], rates[1])
    fmt = ", ".join(f"{x:.2f}" for x in ratios)
    return [Figure("consumer throughput, three nodes / one node (same data)",
                   f"{ratio:.2f}x (rounds: {fmt}; one node median {sorted(rates[1])[len(rates[1]) // 2]:,.0f}/s, "
                   f"three nodes {sorted(rates[3])[len(rates[3]) // 2]:,.0f}/s; to the first item, median: one node "
                   f"{sorted(setup[1])[len(setup[1]) // 2] * 1000:.0f} ms, three nodes "
                   f"{sorted(setup[3])[len(setup[3]) // 2] * 1000:.0f} ms)",
                   ">= 1x", verdict(ratio, 1.0, True),
                   f"{args.consume_items:,} items of {args.consume_value_bytes} B, {args.partitions} partitions, "
                   f"one Consumer(batches) per round in the bench process")]
