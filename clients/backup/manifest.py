"""What an archive knows about itself, as small JSON documents with embedded checksums.

``archive.json`` pins the keyspace (node id, partition count) the archive was made from.  Each run
directory gets ``manifest.json`` written last and atomically: its presence is the run's commit
point.  While a run is in progress each finished partition gets ``parts/pNNNN.json`` (atomic too),
which is what lets a killed run resume instead of starting over.

Positions are full stream offsets, never bare seqnos (uuid, seqno, snapshot range), because a
bare seqno cannot tell the server whether our history is still its history.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.backup.errors import CorruptArchive
from engine.protocol.client.offset import StreamOffset

FORMAT = 1
MAX_BOUNDARIES = 64


ZERO = StreamOffset()


@dataclass(frozen=True, slots=True)
class RollbackRecord:
    """The server refused ``requested`` and sent us back to ``to_seqno`` (0 = full retake)."""

    requested: StreamOffset
    to_seqno: int
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"requested": self.requested.to_dict(), "to_seqno": self.to_seqno, "reason": self.reason}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RollbackRecord":
        return cls(StreamOffset.from_dict(d["requested"]), int(d["to_seqno"]), str(d.get("reason", "")))


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """One partition's part of one run: the range (start, end] it covers and its segment.

    ``start`` is where this run's stream began.  Without a rollback it equals the previous run's
    ``end``; with one, ``start.seqno == rollback.to_seqno`` and every item an earlier run holds
    above that seqno belongs to an abandoned history branch (see ``chain``).
    """

    partition: int
    start: StreamOffset
    end: StreamOffset
    mutations: int = 0
    deletions: int = 0
    segment: str | None = None
    bytes: int = 0
    sha256: str | None = None
    blocks: int = 0
    first_seqno: int = 0
    last_seqno: int = 0
    failover_log: tuple[tuple[int, int], ...] = ()
    rollbacks: tuple[RollbackRecord, ...] = ()
    purge_seqno: int = 0
    #: merged runs only: versions at or above this seqno are exact for any later rollback point
    merge_floor: int = 0
    #: the last complete-snapshot ends of this run (at most ``MAX_BOUNDARIES``): seqnos where the
    #: archive holds an exact state, so a later rollback to one of them stays narrow
    boundaries: tuple[int, ...] = ()
    #: rollbacks inside this run's own range (the server restarted mid-run): (server point, restarted at)
    restarts: tuple[tuple[int, int], ...] = ()

    @property
    def rolled_back(self) -> bool:
        return bool(self.rollbacks)

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "start": self.start.to_dict(),
            "end": self.end.to_dict(),
            "mutations": self.mutations,
            "deletions": self.deletions,
            "segment": self.segment,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "blocks": self.blocks,
            "first_seqno": self.first_seqno,
            "last_seqno": self.last_seqno,
            "failover_log": [list(e) for e in self.failover_log],
            "rollbacks": [r.to_json() for r in self.rollbacks],
            "purge_seqno": self.purge_seqno,
            "merge_floor": self.merge_floor,
            "boundaries": list(self.boundaries),
            "restarts": [list(r) for r in self.restarts],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PartitionRecord":
        return cls(
            partition=int(d["partition"]),
            start=StreamOffset.from_dict(d["start"]),
            end=StreamOffset.from_dict(d["end"]),
            mutations=int(d.get("mutations", 0)),
            deletions=int(d.get("deletions", 0)),
            segment=d.get("segment"),
            bytes=int(d.get("bytes", 0)),
            sha256=d.get("sha256"),
            blocks=int(d.get("blocks", 0)),
            first_seqno=int(d.get("first_seqno", 0)),
            last_seqno=int(d.get("last_seqno", 0)),
            failover_log=tuple((int(u), int(s)) for u, s in d.get("failover_log", [])),
            rollbacks=tuple(RollbackRecord.from_json(r) for r in d.get("rollbacks", [])),
            purge_seqno=int(d.get("purge_seqno", 0)),
            merge_floor=int(d.get("merge_floor", 0)),
            boundaries=tuple(int(b) for b in d.get("boundaries", [])),
            restarts=tuple((int(a), int(b)) for a, b in d.get("restarts", [])),
        )


@dataclass(frozen=True, slots=True)
class RunManifest:
    """A complete run.  ``kind`` is full (every partition from 0), incremental, or merged."""

    run_id: str
    kind: str
    started_at: float
    finished_at: float
    node_id: str
    partition_count: int
    partitions: dict[int, PartitionRecord]
    server: str = ""
    merged_from: tuple[str, ...] = ()
    resumed: int = 0

    @property
    def mutations(self) -> int:
        return sum(r.mutations for r in self.partitions.values())

    @property
    def deletions(self) -> int:
        return sum(r.deletions for r in self.partitions.values())

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.partitions.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "run_id": self.run_id,
            "kind": self.kind,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "node_id": self.node_id,
            "partition_count": self.partition_count,
            "server": self.server,
            "merged_from": list(self.merged_from),
            "resumed": self.resumed,
            "partitions": {str(p): r.to_json() for p, r in sorted(self.partitions.items())},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RunManifest":
        return cls(
            run_id=str(d["run_id"]),
            kind=str(d["kind"]),
            started_at=float(d["started_at"]),
            finished_at=float(d["finished_at"]),
            node_id=str(d["node_id"]),
            partition_count=int(d["partition_count"]),
            server=str(d.get("server", "")),
            merged_from=tuple(d.get("merged_from", [])),
            resumed=int(d.get("resumed", 0)),
            partitions={int(p): PartitionRecord.from_json(r) for p, r in d["partitions"].items()},
        )


@dataclass(frozen=True, slots=True)
class ArchiveMeta:
    """The keyspace identity an archive is bound to, fixed when the archive is created."""

    node_id: str
    partition_count: int
    created_at: float
    format: int = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "node_id": self.node_id,
            "partition_count": self.partition_count,
            "created_at": self.created_at,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ArchiveMeta":
        return cls(
            node_id=str(d["node_id"]),
            partition_count=int(d["partition_count"]),
            created_at=float(d["created_at"]),
            format=int(d.get("format", FORMAT)),
            extra=dict(d.get("extra", {})),
        )


# ---------------------------------------------------------------------------- sealed JSON
def seal(doc: dict[str, Any]) -> bytes:
    """Serialise with a sha256 of the canonical body, so a damaged manifest is detected, not trusted."""
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()
    return (json.dumps({"sha256": digest, "body": doc}, sort_keys=True, indent=1) + "\n").encode()


def unseal(data: bytes, *, path: str) -> dict[str, Any]:
    try:
        outer = json.loads(data)
        doc = outer["body"]
        digest = outer["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptArchive(f"not a sealed JSON document ({exc})", path=path) from None
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    if hashlib.sha256(body.encode()).hexdigest() != digest:
        raise CorruptArchive("checksum mismatch", path=path)
    if not isinstance(doc, dict):
        raise CorruptArchive("document body is not an object", path=path)
    return doc


def read_sealed(path: Path, *, display: str | None = None) -> dict[str, Any]:
    return unseal(path.read_bytes(), path=display or str(path))
