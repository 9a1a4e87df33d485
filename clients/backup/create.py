"""``create``: one backup run, streamed "until now" from where the previous run ended.

Per partition the stream starts at the previous run's end offset (uuid, seqno, snapshot range) -
or at 0 for the first run - and is bounded at the high seqno the server reports at handshake
(``until_now``), so a run always ends even under constant writes.  The stream's own bound rule
(end after the complete snapshot containing the end seqno) means every run ends on a snapshot
boundary, which is what lets the next run resume without a partial-snapshot rollback.

The keyspace (node id, partition count) is checked over HTTP before anything is written, the
archive's write lock is held for the whole run, and the streaming itself (rollbacks, restarts,
resume from checkpoints) is ``driver.Driver``'s job.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.backup.archive import Archive
from clients.backup.driver import Driver
from clients.backup.manifest import RunManifest
from clients.backup.runwriter import RunWriter
from clients.backup.segment import DEFAULT_BLOCK_BYTES, DEFAULT_LEVEL
from clients.errors import ConnectionFailed, HttpError
from clients.http import HttpApi
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.session import DEFAULT_WINDOW


@dataclass(slots=True)
class CreateResult:
    manifest: RunManifest
    resumed: bool
    partitions_taken: int
    partitions_reused: int
    mutations: int = 0
    deletions: int = 0
    bytes: int = 0
    stream_bytes: int = 0
    seconds: float = 0.0
    in_run_rollbacks: list[tuple[int, int]] = field(default_factory=list)
    #: partitions a killed run had partly streamed, and the checkpoint seqno they continued from
    resumed_at: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        from clients.backup.info import run_info

        return {
            "run": run_info(self.manifest, partitions=False), "resumed": self.resumed,
            "partitions_taken": self.partitions_taken, "partitions_reused": self.partitions_reused,
            "mutations": self.mutations, "deletions": self.deletions, "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "in_run_rollbacks": [{"partition": p, "seqno": s} for p, s in self.in_run_rollbacks],
            "resumed_at": {str(p): s for p, s in sorted(self.resumed_at.items())},
        }


#: the keyspace an archive of a cluster is bound to.  A cluster has no id of its own (each node's
#: store has its node's); a foreign or recreated history is caught per partition by its failover
#: log instead (the stream rolls the partition back, to 0 at worst, and the run retakes it).
CLUSTER_KEYSPACE = "cluster"


def server_keyspace(server: str | Sequence[str], token: str | None) -> tuple[str, int, dict[int, dict[str, Any]]]:
    """(keyspace id, partition count, partition infos) from the HTTP API: checked before anything
    is written.  A cluster (``GET /cluster`` answers a map, from any of the nodes named): each
    partition's info from its active node, and ``CLUSTER_KEYSPACE``."""
    with HttpApi(_address(server), token) as api:
        try:
            view = api.cluster()
        except HttpError as exc:
            if exc.status != 404:
                raise
            view = None
        if view is None or not view.get("map", {}).get("partitions"):
            status = api.status()
            parts = api.partitions()
            return str(status["node_id"]), len(parts), {int(p["partition"]): p for p in parts}
    actives = {int(e["partition"]): e.get("active") for e in view["map"]["partitions"]}
    urls = {n["name"]: n["url"] for n in view["nodes"] if n.get("url") and n.get("state", "up") == "up"}
    infos: dict[int, dict[str, Any]] = {}
    for node, url in sorted(urls.items()):
        mine = {p for p, a in actives.items() if a == node}
        if not mine:
            continue
        try:
            with HttpApi(url, token) as api:
                infos.update({int(i["partition"]): i for i in api.partitions() if int(i["partition"]) in mine})
        except ConnectionFailed:
            continue  # only the progress total needs them; the stream follows the map
    return CLUSTER_KEYSPACE, len(actives), infos


def _address(server: str | Sequence[str]) -> str:
    """One URL, "URL,URL" or a list: the comma form every client here parses (``parse_servers``)."""
    return server if isinstance(server, str) else ",".join(server)


def create_backup(
    archive_dir: str | Path,
    server: str | Sequence[str],
    *,
    token: str | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    level: int = DEFAULT_LEVEL,
    idle_timeout: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
    name: str = "upr-backup",
    full: bool = False,
    reconnect_attempts: int = 10,
    window_bytes: int = DEFAULT_WINDOW,
) -> CreateResult:
    """Take one run (``full=True``: every partition from 0 even when earlier runs exist; an
    interrupted run is always continued as what it started as).

    ``server``: one node, or a cluster's nodes (a list or "URL,URL"; any will do): each partition
    is then streamed from its active node, following the map through moves and failovers, and
    its positions stay per partition whichever node served them.  ``window_bytes``: how much
    each stream connection may send ahead of what the archive took (flow control)."""
    t0 = time.perf_counter()
    server = _address(server)
    node_id, count, infos = server_keyspace(server, token)
    archive = Archive.open_or_create(archive_dir, node_id, count)
    with archive.lock("write"):
        run = RunWriter.begin(archive, server=server, block_bytes=block_bytes, level=level, full=full)
        runs = archive.runs()
        starts = {p: rec.end for p, rec in runs[-1].partitions.items()} if runs else {}
        todo = [p for p in range(count) if p not in run.done]
        reused = count - len(todo)
        result_rollbacks: list[tuple[int, int]] = []
        resumed_at: dict[int, int] = {}
        if todo:
            offsets = {p: starts.get(p, StreamOffset()) for p in todo}
            driver = Driver(run, server, token, offsets, idle_timeout, progress, 0, f"{name}-{run.run_id}",
                            reconnect_attempts=reconnect_attempts, window_bytes=window_bytes)
            driver.total = sum(max(0, int(infos.get(p, {}).get("high_seqno", 0)) - off.seqno)
                               for p, off in driver.offsets.items())
            asyncio.run(driver.run())
            result_rollbacks = driver.in_run_rollbacks
            resumed_at = driver.resumed_at
        manifest = run.commit(node_id, count)
    return CreateResult(
        manifest=manifest, resumed=run.resumed, partitions_taken=len(todo), partitions_reused=reused,
        mutations=manifest.mutations, deletions=manifest.deletions, bytes=manifest.bytes,
        seconds=time.perf_counter() - t0, in_run_rollbacks=result_rollbacks, resumed_at=resumed_at,
    )


