"""Where restore sends a partition's writes: the one server, or the partition's active node in a cluster.

A restore writes partition by partition (``restore.one``), so every bulk request holds one
partition's keys and can go straight to that partition's active node, as the map in ``GET
/cluster`` says, instead of through a node that would refuse most of a mixed batch item by item
(``421``).  The map is read again whenever a write meets a sign that it moved on: an item
answered 421 or 503 (a handover pauses the partition's writes), a node that does not answer, or a
partition without an active node; the batch is then sent again (restore writes are idempotent).
Each partition's ``epoch`` counts the times a map read named another active for it (or none):
restore compares the epochs its batches were sent at to tell a partition whose active changed
mid-restore (``partition_rounds``).

A server that answers ``GET /cluster`` with 404 is a single node: every write goes to it, as before.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from clients.errors import ConnectionFailed, HttpError
from clients.http import HttpApi
from clients.redirects import parse_servers

__all__ = ["PartitionTargets", "MOVED_STATUSES"]

#: an item answered with one of these in a cluster: the partition is (being) served elsewhere
MOVED_STATUSES = {421, 503}

#: a map read this recently is not read again for another thread's failed write (they see the same map)
MIN_REREAD_S = 0.05


class PartitionTargets:
    """Partition -> base URL of the node its writes go to; thread-safe (restore's workers share it)."""

    def __init__(self, server: str, token: str | None, *, timeout: float = 10.0) -> None:
        self.servers = parse_servers(server)
        self.token = token
        self.timeout = timeout
        self._lock = threading.Lock()
        #: None: a single node (no map); else partition -> URL of its active (None: no active now)
        self.urls: dict[int, str | None] | None = None
        self.revision = -1
        self._epochs: dict[int, int] = {}
        self._read_at = 0.0
        self.refresh(force=True)

    @property
    def cluster(self) -> bool:
        return self.urls is not None

    def url_of(self, partition: int) -> str | None:
        """Where ``partition``'s writes go now (every URL named, comma-joined, for a single node)."""
        if self.urls is None:
            return ",".join(self.servers)
        return self.urls.get(partition)

    def epoch_of(self, partition: int) -> int:
        """How many times the map was seen to name another active for ``partition`` (0 on a single node)."""
        return self._epochs.get(partition, 0)

    def refresh(self, *, force: bool = False) -> None:
        """Read the map again from any node named or known (``ConnectionFailed`` when none answers)."""
        with self._lock:
            if not force and time.monotonic() - self._read_at < MIN_REREAD_S:
                return
            known = [u for u in (self.urls or {}).values() if u]
            candidates = list(dict.fromkeys([*self.servers, *sorted(set(known))]))
            last: Exception | None = None
            for url in candidates:
                try:
                    with HttpApi(url, self.token, timeout=self.timeout) as api:
                        view = api.cluster()
                except HttpError as exc:
                    if exc.status in (401, 403):
                        raise
                    if exc.status == 404 and self.urls is None:
                        self._read_at = time.monotonic()
                        return  # a single node
                    last = exc
                    continue
                except ConnectionFailed as exc:
                    last = exc
                    continue
                self._adopt(view)
                self._read_at = time.monotonic()
                return
            raise ConnectionFailed(f"no node answered GET /cluster ({', '.join(candidates)}): {last}")

    def _adopt(self, view: dict[str, Any]) -> None:
        revision = int(view["map"]["revision"])
        if revision < self.revision:
            return  # a node behind the one read before
        nodes = {n["name"]: n.get("url") for n in view["nodes"] if n.get("state", "up") == "up"}
        before = self.urls
        self.urls = {int(e["partition"]): (nodes.get(e["active"]) if e.get("active") else None)
                     for e in view["map"]["partitions"]}
        if before is not None:
            for p, url in self.urls.items():
                if before.get(p) != url:
                    self._epochs[p] = self._epochs.get(p, 0) + 1
        self.revision = revision
