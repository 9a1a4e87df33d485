"""Where the cluster keeps its state in etcd: one prefix per cluster, one key per concern.

    <prefix>/settings                 {"partitions": N, "replicas": R}: fixed when the cluster is created
    <prefix>/nodes/<name>             {"name", "url"}: under the node's lease, so it goes when the node dies
    <prefix>/orchestrator             the elected orchestrator's name, under its lease
    <prefix>/map                      the partition map (engine.cluster.partition_map JSON)
    <prefix>/progress/<p>/<name>      what the replica on <name> holds of partition p, under its lease

Keys are bytes because etcd's are; values are JSON.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Layout:
    prefix: str = "/upr/default"

    def _key(self, *parts: str) -> bytes:
        return "/".join((self.prefix.rstrip("/"), *parts)).encode()

    @property
    def settings(self) -> bytes:
        return self._key("settings")

    @property
    def nodes(self) -> bytes:
        return self._key("nodes", "")

    def node(self, name: str) -> bytes:
        return self._key("nodes", name)

    def node_name(self, key: bytes) -> str:
        return key[len(self.nodes):].decode()

    @property
    def orchestrator(self) -> bytes:
        return self._key("orchestrator")

    @property
    def map(self) -> bytes:
        return self._key("map")

    @property
    def progress(self) -> bytes:
        return self._key("progress", "")

    def replica_progress(self, partition: int, node: str) -> bytes:
        return self._key("progress", str(partition), node)

    def progress_owner(self, key: bytes) -> tuple[int, str]:
        partition, node = key[len(self.progress):].decode().split("/", 1)
        return int(partition), node
