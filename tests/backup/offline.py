"""An in-memory partition history and an offline run writer, for tests that need no server.

``History`` is the model: per partition, the list of every change ever made (seqno order).  The
state "as of seqno S" is the fold of changes up to S.  ``write_run`` backs up each partition from
its previous end to the model's current high seqno, as ``create`` does from a stream.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from clients.backup.archive import Archive
from clients.backup.manifest import RunManifest
from clients.backup.runwriter import RunWriter
from engine.core.types import Item
from engine.protocol.client.offset import StreamOffset

UUID = 0xABCDEF


@dataclass
class History:
    partitions: int
    changes: dict[int, list[Item]] = field(default_factory=dict)
    cas: int = 0

    def __post_init__(self) -> None:
        for p in range(self.partitions):
            self.changes.setdefault(p, [])

    def high(self, p: int) -> int:
        return self.changes[p][-1].seqno if self.changes[p] else 0

    def write(self, p: int, key: str, value: bytes | None) -> Item:
        self.cas += 1
        item = Item(key.encode(), self.high(p) + 1, self.cas, 1, value is None, value or b"")
        self.changes[p].append(item)
        return item

    def truncate(self, p: int, seqno: int) -> None:
        """The server lost everything after ``seqno`` (crash before persisting)."""
        self.changes[p] = [i for i in self.changes[p] if i.seqno <= seqno]

    def state(self, p: int, upto: int | None = None) -> dict[bytes, bytes | None]:
        out: dict[bytes, bytes | None] = {}
        for i in self.changes[p]:
            if upto is not None and i.seqno > upto:
                break
            out[i.key] = None if i.deleted else i.value
        return out

    def random_writes(self, rng: random.Random, n: int, keys: int = 50, delete_ratio: float = 0.2) -> None:
        for _ in range(n):
            p = rng.randrange(self.partitions)
            key = f"k{p}-{rng.randrange(keys)}"
            value = None if rng.random() < delete_ratio else f"v{rng.random()}".encode() * rng.randint(1, 5)
            self.write(p, key, value)


def dedup(items: list[Item]) -> list[Item]:
    """One snapshot holds each key at most once (its latest version), as the server sends it."""
    latest: dict[bytes, Item] = {}
    for i in items:
        latest[i.key] = i
    return sorted(latest.values(), key=lambda i: i.seqno)


def take_partition(run: RunWriter, h: History, p: int, start: StreamOffset, *, snapshot_size: int = 7) -> None:
    """Back up one partition from ``start`` to the model's high seqno in snapshots of a few seqnos."""
    w = run.partition(p, start)
    pending = [i for i in h.changes[p] if i.seqno > start.seqno]
    end = h.high(p)
    lo = start.seqno + 1
    while lo <= end:
        hi = min(lo + snapshot_size - 1, end)
        w.snapshot(lo, hi, "memory")
        w.add_many(dedup([i for i in pending if lo <= i.seqno <= hi]))
        w.snapshot_complete(hi, UUID, lo)
        lo = hi + 1
    w.finish(StreamOffset.at(UUID, max(end, start.seqno)), failover_log=((UUID, 0),))


def previous_ends(archive: Archive) -> dict[int, StreamOffset]:
    runs = archive.runs()
    if not runs:
        return {}
    return {p: rec.end for p, rec in runs[-1].partitions.items()}


def write_run(archive: Archive, h: History, *, only: set[int] | None = None, commit: bool = True) -> RunWriter:
    run = RunWriter.begin(archive, server="offline", block_bytes=512)
    ends = previous_ends(archive)
    for p in range(h.partitions):
        if p in run.done or (only is not None and p not in only):
            continue
        take_partition(run, h, p, ends.get(p, StreamOffset()))
    if commit:
        run.commit(archive.meta.node_id, archive.meta.partition_count)
    return run


def restored_state(archive: Archive, run_spec: str | None, partitions: list[int] | None = None,
                   key_filter: str | None = None) -> dict[int, dict[bytes, bytes | None]]:
    import re

    from clients.backup.plan import plan_partitions, runs_upto

    target, runs = runs_upto(archive, run_spec)
    parts = partitions if partitions is not None else sorted(target.partitions)
    rx = re.compile(key_filter) if key_filter else None
    out: dict[int, dict[bytes, bytes | None]] = {}
    for plan, _ in plan_partitions(archive, runs, parts, rx):
        out[plan.partition] = {i.key: (None if i.deleted else i.value) for i in plan.items}
    return out


def expected_state(h: History, ends: dict[int, int]) -> dict[int, dict[bytes, bytes | None]]:
    return {p: h.state(p, e) for p, e in ends.items()}


def run_ends(run: RunManifest) -> dict[int, int]:
    return {p: rec.end.seqno for p, rec in run.partitions.items()}
