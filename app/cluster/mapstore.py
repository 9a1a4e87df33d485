"""The partition map in etcd: read with the revision it was stored at, replaced only by a
transaction that compares that revision (and the orchestrator's hold on its key), so two
orchestrators can never both change it and the map's revision never forks."""
from __future__ import annotations

import json
from collections.abc import Sequence

from app.cluster.etcd import Compare, EtcdClient, Put
from app.cluster.layout import Layout
from engine.cluster.partition_map import PartitionMap


class MapStore:
    def __init__(self, etcd: EtcdClient, layout: Layout) -> None:
        self.etcd, self.layout = etcd, layout

    async def load(self, partitions: int) -> tuple[PartitionMap, int]:
        """The stored map and its etcd mod revision; an empty revision-0 map (mod 0) if none yet."""
        kv = await self.etcd.get(self.layout.map)
        if kv is None:
            return PartitionMap.empty(partitions), 0
        return PartitionMap.from_json(json.loads(kv.value)), kv.mod_revision

    async def publish(self, new: PartitionMap, based_on: int, guards: Sequence[Compare] = ()) -> bool:
        """Store ``new`` if the map is still at etcd mod revision ``based_on`` (0: absent) and every
        guard holds; False when another writer got there first."""
        result = await self.etcd.txn(
            [Compare(self.layout.map, "mod", based_on), *guards],
            [Put(self.layout.map, json.dumps(new.to_json(), separators=(",", ":")).encode())],
        )
        return result.succeeded
