"""Typed events a consumer hands to its handler (frozen, slotted, defined once: h11's ``_events.py`` habit).

    Mutation / Deletion   one item; ``correction=True`` when it comes from a rollback repair (the key's
                          current document read over HTTP), not from the stream
    SnapshotStart/End     bracket a snapshot: between them the consumer holds a *partial* snapshot, which
                          is not a state that ever existed (dedup); apply atomically at SnapshotEnd if it
                          matters (dcp.md §3, "partial snapshots published")
    Rollback              the server's history branched at ``seqno``; corrections (if any) were delivered
                          just before this event and the partition resumes from ``resume`` (at ``seqno``)
                          unless the handler calls ``consumer.seek`` for it while handling this event
    PartitionReset        the rollback went deeper than the ring covers: drop everything of the partition;
                          it is streamed again from 0 right after
    StreamEnd             a partition's stream ended (bounded stream done, or the server says why);
                          ``lowered_from`` when an ``until_now`` end was lowered after a history branch
    BarrierReached        a barrier cookie came back: every partition was seen at a consistent point
    PartitionMoved        (cluster) a partition is no longer active on the node that streamed it; it
                          resumes on its new active from its processed position
    PartitionsUnavailable (cluster) the map names no node (or a down one) for these partitions; they
                          are retried until a node serves them
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterator
from itertools import repeat
from typing import Any, NamedTuple, Union

from engine.protocol.client.offset import StreamOffset

__all__ = [
    "events_of",
    "Mutation", "Deletion", "SnapshotStart", "SnapshotEnd", "Rollback", "PartitionReset", "StreamEnd",
    "BarrierReached", "PartitionMoved", "PartitionsUnavailable", "Event",
]


class Mutation(NamedTuple):
    """A key's new version.  A named tuple, not a dataclass: one is built per streamed item, and a
    frozen dataclass costs about three times as much to construct (measured: bench/bench_client.py)."""

    partition: int
    seqno: int
    key: str
    value: bytes
    cas: int
    rev: int
    correction: bool = False

    @property
    def op(self) -> str:
        return "mutation"


class Deletion(NamedTuple):
    """A key's deletion (tombstone).  For a correction the seqno is the rollback seqno (the
    tombstone's own seqno is not known to a GET that answers 404)."""

    partition: int
    seqno: int
    key: str
    cas: int
    rev: int
    correction: bool = False

    @property
    def op(self) -> str:
        return "deletion"


@dataclass(frozen=True, slots=True)
class SnapshotStart:
    partition: int
    start: int
    end: int
    source: str
    purge_seqno: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotEnd:
    partition: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Rollback:
    partition: int
    seqno: int
    reason: str | None
    detail: str | None = None
    #: Keys re-read and delivered as corrections just before this event.
    corrections: int = 0
    #: Where the partition resumes unless the handler calls ``consumer.seek`` for it while
    #: handling this event (the newest branch at or below ``seqno``; from 0 if none reaches it).
    resume: StreamOffset | None = None


@dataclass(frozen=True, slots=True)
class PartitionReset:
    partition: int
    rollback_seqno: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class StreamEnd:
    partition: int
    reason: str
    last_seqno: int | None
    #: ``until_now`` end seqno first taken, when a new history branch (unclean server restart,
    #: failover) had fewer items and the end was lowered to its high seqno; None otherwise.
    lowered_from: int | None = None


@dataclass(frozen=True, slots=True)
class BarrierReached:
    cookie: str
    seqnos: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionMoved:
    partition: int
    #: ``not_my_partition``, ``state_changed``
    reason: str
    #: the node that stopped serving it (None when not known)
    node: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionsUnavailable:
    partitions: tuple[int, ...]
    reason: str


Event = Union[Mutation, Deletion, SnapshotStart, SnapshotEnd, Rollback, PartitionReset, StreamEnd, BarrierReached,
              PartitionMoved, PartitionsUnavailable]


_new = tuple.__new__


def events_of(batch: Any) -> Iterator[Mutation | Deletion]:
    """The items of an ``ItemBatch`` as ``Mutation``/``Deletion`` events, lazily.

    The common all-mutations batch is built by C-level ``map`` calls only (about half the cost of
    a per-item Python loop); a batch with deletions takes the per-item path."""
    p = batch.partition
    keys = map(bytes.decode, batch.keys)
    if not batch.deleted.count(1):
        return map(_new, repeat(Mutation),
                   zip(repeat(p), batch.seqnos, keys, batch.values, batch.cas, batch.revs, repeat(False)))
    return (_new(Deletion, (p, s, k, c, r, False)) if d else _new(Mutation, (p, s, k, v, c, r, False))
            for k, s, c, r, d, v in zip(keys, batch.seqnos, batch.cas, batch.revs, batch.deleted, batch.values))
