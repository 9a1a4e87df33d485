"""The partition map: for every partition, its active node and its replica nodes.

The map is the cluster's one source of truth about ownership.  It carries a ``revision`` that
only grows: a node fences writes with it (a node serves a partition only while the newest map
it has seen names it active), and the orchestrator publishes a new map only if the stored one
still has the revision it computed from, so two orchestrators can never both win.

The JSON form is what etcd stores and what ``GET /cluster`` answers; it is plain primitives so
that clients in any language can read it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class MapFormatError(ValueError):
    """A stored or received map is not well formed; says which field and why."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one partition's copies live.  ``active`` is None while no node may serve it."""

    active: str | None
    replicas: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        copies = [n for n in (self.active, *self.replicas) if n is not None]
        if len(set(copies)) != len(copies):
            raise MapFormatError(f"a node holds two copies of one partition: {copies}")

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node holding a copy, the active first."""
        return ((self.active,) if self.active is not None else ()) + self.replicas

    def holds(self, node: str) -> bool:
        return node == self.active or node in self.replicas


@dataclass(frozen=True, slots=True)
class PartitionMap:
    """An immutable map at one revision; changes produce a new map with the next revision."""

    revision: int
    placements: tuple[Placement, ...]

    @property
    def num_partitions(self) -> int:
        return len(self.placements)

    def active_of(self, partition: int) -> str | None:
        return self.placements[partition].active

    def active_partitions(self, node: str) -> tuple[int, ...]:
        return tuple(p for p, placement in enumerate(self.placements) if placement.active == node)

    def replica_partitions(self, node: str) -> tuple[int, ...]:
        return tuple(p for p, placement in enumerate(self.placements) if node in placement.replicas)

    def nodes(self) -> frozenset[str]:
        """Every node that holds at least one copy."""
        return frozenset(n for placement in self.placements for n in placement.nodes)

    def succeeded_by(self, placements: Sequence[Placement]) -> PartitionMap:
        """The next revision with ``placements`` (the partition count never changes)."""
        if len(placements) != len(self.placements):
            raise MapFormatError(
                f"a map of {len(placements)} partitions cannot follow one of {len(self.placements)}"
            )
        return PartitionMap(self.revision + 1, tuple(placements))

    def changed_partitions(self, other: PartitionMap) -> tuple[int, ...]:
        """Partitions whose placement differs between this map and ``other``."""
        return tuple(
            p for p, (a, b) in enumerate(zip(self.placements, other.placements, strict=True)) if a != b
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "partitions": [
                {"partition": p, "active": placement.active, "replicas": list(placement.replicas)}
                for p, placement in enumerate(self.placements)
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionMap:
        """Parse and validate the JSON form; raise ``MapFormatError`` naming the bad field."""
        revision = data.get("revision") if isinstance(data, Mapping) else None
        if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
            raise MapFormatError("revision must be a non-negative integer")
        entries = data.get("partitions")
        if not isinstance(entries, list):
            raise MapFormatError("partitions must be a list")
        return cls(revision, tuple(placement_from_json(i, e) for i, e in enumerate(entries)))

    @classmethod
    def empty(cls, partitions: int) -> PartitionMap:
        """Revision 0: no partition has a home yet (the cluster was just created)."""
        return cls(0, tuple(Placement(None) for _ in range(partitions)))


def placement_from_json(index: int, entry: Any) -> Placement:
    where = f"partitions[{index}]"
    if not isinstance(entry, Mapping):
        raise MapFormatError(f"{where} must be an object")
    if entry.get("partition") != index:
        raise MapFormatError(f"{where}.partition must be {index}")
    active = entry.get("active")
    if active is not None and not _is_node_name(active):
        raise MapFormatError(f"{where}.active must be a node name or null")
    replicas = entry.get("replicas", [])
    if not isinstance(replicas, list) or not all(_is_node_name(r) for r in replicas):
        raise MapFormatError(f"{where}.replicas must be a list of node names")
    try:
        return Placement(active, tuple(replicas))
    except MapFormatError as exc:
        raise MapFormatError(f"{where}: {exc}") from None


def _is_node_name(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def copies_per_node(placements: Iterable[Placement]) -> dict[str, tuple[int, int]]:
    """(actives, replicas) held by each node: what balance is judged on."""
    counts: dict[str, list[int]] = {}
    for placement in placements:
        if placement.active is not None:
            counts.setdefault(placement.active, [0, 0])[0] += 1
        for replica in placement.replicas:
            counts.setdefault(replica, [0, 0])[1] += 1
    return {node: (a, r) for node, (a, r) in counts.items()}
