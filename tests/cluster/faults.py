"""What the cluster's fault tests check against: the map key's whole history in etcd, and which
nodes accept a write for each partition at one moment."""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from app.cluster.etcd import EtcdClient, EtcdError
from app.cluster.layout import Layout
from tests.cluster.nodes import Cluster, partition_of


def map_history(etcd_url: str, prefix: str, idle_s: float = 1.0) -> list[tuple[int, int]]:
    """Every write of the map key since etcd started: (etcd mod revision, map revision), in order.

    A watch from etcd revision 1 replays the key's history (the test etcd never compacts)."""
    async def read() -> list[tuple[int, int]]:
        client = EtcdClient([etcd_url])
        seen: list[tuple[int, int]] = []
        key = Layout(prefix).map

        async def collect() -> None:
            async for event in client.watch_prefix(key, 1):
                if event.kv.key == key and event.kind == "put":
                    seen.append((event.kv.mod_revision, int(json.loads(event.kv.value)["revision"])))

        try:
            task = asyncio.create_task(collect())
            count = -1
            while count != len(seen):  # until a whole idle period brings nothing new
                count = len(seen)
                await asyncio.sleep(idle_s)
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, EtcdError):
                pass
        finally:
            await client.aclose()
        return seen

    return asyncio.run(read())


def assert_one_history(history: list[tuple[int, int]]) -> None:
    """The map's revisions form one sequence, each write the next revision: it never forked."""
    assert history, "the map was never written"
    revisions = [r for _, r in history]
    assert revisions == list(range(1, len(revisions) + 1)), revisions
    mods = [m for m, _ in history]
    assert mods == sorted(set(mods)), mods


def keys_per_partition(partitions: int) -> dict[int, str]:
    """One key of each partition."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < partitions:
        keys.setdefault(partition_of(f"probe-{i}", partitions), f"probe-{i}")
        i += 1
    return keys


def accepting(cluster: Cluster, names: list[str], keys: dict[int, str], tag: str, timeout: float = 30.0,
              statuses: dict[tuple[int, str], int] | None = None) -> dict[int, list[str]]:
    """Write every partition's key on every node in ``names`` at once: partition -> nodes that accepted.
    ``statuses`` (if given) receives each answer's status (0: no answer), for assertion messages."""
    def put(job: tuple[int, str]) -> tuple[int, str, int]:
        p, name = job
        try:
            r = httpx.put(f"{cluster.nodes[name].url}/docs/{keys[p]}", content=f"{tag}-{name}".encode(),
                          timeout=timeout)
            return p, name, r.status_code
        except httpx.HTTPError:
            return p, name, 0

    jobs = [(p, n) for p in keys for n in names]
    out: dict[int, list[str]] = {p: [] for p in keys}
    with ThreadPoolExecutor(max_workers=min(len(jobs), 32)) as pool:
        for p, name, status in pool.map(put, jobs):
            if statuses is not None:
                statuses[(p, name)] = status
            if 200 <= status < 300:
                out[p].append(name)
    return out


def view_or_none(cluster: Cluster, name: str) -> dict[str, Any] | None:
    try:
        return cluster.view(name)
    except (httpx.HTTPError, AssertionError):
        return None
