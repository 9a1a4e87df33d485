"""Value types shared by the engine, the server, the protocol and the clients.

Pure standard library: clients import this module, so it must never pull in LMDB,
pyrsistent or a web framework.  Items travel through the hot paths (write queue,
flusher, snapshot reader, frame encoder) as ``Item`` named tuples because tuple
construction is the cheapest object Python makes.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

MAX_SEQNO = (1 << 64) - 1


class Op(enum.IntEnum):
    """What a change did to its key."""

    MUTATION = 0
    DELETION = 1


# Enums whose value travels as text are StrEnums: a member formats as its value, so a message or
# log line reads the same whether it holds the member or the wire text.


class PartitionState(enum.StrEnum):
    """DCP's vbucket states; only ``ACTIVE`` partitions accept client writes."""

    ACTIVE = "active"
    REPLICA = "replica"
    PENDING = "pending"
    DEAD = "dead"


class Durability(enum.StrEnum):
    """When a write is acknowledged: once queued in memory, or once fsynced by a flush, on the
    active alone; or once a majority of the partition's copies hold it in memory
    (``majority``) or have persisted it (``persist_majority``, the active among them), as
    Couchbase's durability levels.  With one copy (no replicas, no cluster) a majority is the
    active itself: ``majority`` is ``memory`` and ``persist_majority`` is ``persist``."""

    MEMORY = "memory"
    PERSIST = "persist"
    MAJORITY = "majority"
    PERSIST_MAJORITY = "persist_majority"

    @property
    def persist(self) -> bool:
        """The active waits for its own fsync."""
        return self in (Durability.PERSIST, Durability.PERSIST_MAJORITY)

    @property
    def majority(self) -> bool:
        """The write waits for a majority of the partition's copies."""
        return self in (Durability.MAJORITY, Durability.PERSIST_MAJORITY)


class Item(NamedTuple):
    """One version of one key, as stored and streamed.

    ``key`` is the UTF-8 encoded key.  A deletion (tombstone) has ``deleted=True``
    and an empty value.
    """

    key: bytes
    seqno: int
    cas: int
    rev: int
    deleted: bool
    value: bytes


@dataclass(frozen=True, slots=True)
class FailoverEntry:
    """A history branch: from ``seqno`` on, the partition's history is identified by ``uuid``."""

    uuid: int
    seqno: int


class WriteOp(NamedTuple):
    """One requested mutation; ``cas`` set means compare-and-swap against the current CAS.

    A named tuple rather than a frozen dataclass, for the same reason as ``WriteResult``: the
    bulk path builds one per item, and a frozen dataclass costs several times as much to build
    as ``tuple.__new__`` (see docs/benchmarks.md, HTTP: the bulk breakdown)."""

    op: Op
    key: str
    value: bytes = b""
    cas: int | None = None


class WriteResult(NamedTuple):
    """What the engine assigned to an accepted write, so a writer can later ask
    "has my write been streamed/persisted?" by (partition, seqno).

    A named tuple rather than a frozen dataclass: the engine makes one per write, and a
    frozen dataclass costs several times as much to build as a tuple (see docs/benchmarks.md,
    HTTP: the bulk breakdown)."""

    key: str
    partition: int
    seqno: int
    cas: int
    rev: int
    deleted: bool


@dataclass(frozen=True, slots=True)
class Document:
    """The current version of a key as read by ``Engine.get``."""

    key: str
    partition: int
    seqno: int
    cas: int
    rev: int
    deleted: bool
    value: bytes


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """A consistent-enough reading of one partition's counters for status endpoints."""

    partition: int
    state: PartitionState
    high_seqno: int
    persisted_seqno: int
    purge_seqno: int
    item_count: int
    queue_depth: int
    queue_bytes: int
    failover_log: tuple[FailoverEntry, ...] = field(default_factory=tuple)

    @property
    def uuid(self) -> int:
        return self.failover_log[0].uuid if self.failover_log else 0
