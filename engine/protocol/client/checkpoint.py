"""What a consumer must remember per partition to resume without skipping anything, as values.

Per partition (a ``PartitionCheckpoint``): the failover log last seen, the ``StreamOffset`` of the last
item *processed* (uuid, seqno, and the snapshot range it lies in, possibly partial), and the last
snapshot processed completely.  A ``ConsumerState`` is all of them plus the node and partition
count they came from, with its JSON form (the ``state.json`` of ``clients.state.FileStateStore``).
Saved state only ever describes processed items (dcp.md §3.4).  Values only: where the JSON is kept
is the adapter's business, so the client session can produce and read states without any I/O.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.types import FailoverEntry

from .errors import StateCorrupt
from .offset import StreamOffset

__all__ = ["STATE_VERSION", "PartitionCheckpoint", "ConsumerState"]

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class PartitionCheckpoint:
    offset: StreamOffset
    failover_log: tuple[FailoverEntry, ...] = ()
    last_complete: tuple[int, int] = (0, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "offset": self.offset.to_dict(),
            "failover_log": [[e.uuid, e.seqno] for e in self.failover_log],
            "last_complete": list(self.last_complete),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PartitionCheckpoint":
        log = tuple(FailoverEntry(int(u), int(s)) for u, s in data.get("failover_log", ()))
        start, end = data.get("last_complete", (0, 0))
        return cls(StreamOffset.from_dict(data["offset"]), log, (int(start), int(end)))


@dataclass(frozen=True, slots=True)
class ConsumerState:
    partitions: Mapping[int, PartitionCheckpoint] = field(default_factory=dict)
    node_id: str | None = None
    partition_count: int | None = None

    def offsets(self) -> dict[int, StreamOffset]:
        return {p: c.offset for p, c in self.partitions.items()}

    def to_json(self) -> bytes:
        doc = {
            "version": STATE_VERSION,
            "node_id": self.node_id,
            "partition_count": self.partition_count,
            "partitions": {str(p): c.to_dict() for p, c in sorted(self.partitions.items())},
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, source: str = "state") -> "ConsumerState":
        try:
            doc = json.loads(raw)
            if doc.get("version") != STATE_VERSION:
                raise StateCorrupt(f"{source}: unsupported state version {doc.get('version')!r}")
            parts = {int(p): PartitionCheckpoint.from_dict(c) for p, c in doc["partitions"].items()}
            return cls(parts, doc.get("node_id"), doc.get("partition_count"))
        except StateCorrupt:
            raise
        except Exception as exc:  # any shape error: the file cannot be trusted
            raise StateCorrupt(f"{source}: cannot read consumer state: {exc}") from None
