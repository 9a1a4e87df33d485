"""Restore planning: the latest version of every key as of one run, honouring rollbacks.

Keys never move between partitions, so the plan is built one partition at a time and memory is
bounded by the largest partition, not the archive.  Deletions stay in the plan: restoring "as of
run X" into a server that already has data must delete what was deleted by then.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from clients.backup.archive import Archive
from clients.backup.chain import Link, links
from clients.backup.manifest import RunManifest
from clients.backup.segment import SegmentReader
from engine.core.types import Item


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    partition: int
    items: list[Item]  # one per key, seqno order; deleted=True means "delete this key"

    @property
    def sets(self) -> int:
        return sum(1 for i in self.items if not i.deleted)

    @property
    def deletes(self) -> int:
        return sum(1 for i in self.items if i.deleted)


@dataclass(slots=True)
class PlanSummary:
    run_id: str
    partitions: dict[int, tuple[int, int]] = field(default_factory=dict)  # p -> (sets, deletes)
    skipped_keys: int = 0

    @property
    def sets(self) -> int:
        return sum(s for s, _ in self.partitions.values())

    @property
    def deletes(self) -> int:
        return sum(d for _, d in self.partitions.values())


def runs_upto(archive: Archive, run_spec: str | None) -> tuple[RunManifest, list[RunManifest]]:
    target = archive.find_run(run_spec)
    runs = archive.runs()
    return target, runs[: runs.index(target) + 1]


def read_link(archive: Archive, link: Link) -> Iterator[Item]:
    """The items of one link that are still history (seqno <= ceiling)."""
    if not link.usable:
        return
    seg = link.record.segment
    assert seg is not None
    path = archive.segment_path(link.run_id, seg, partition=link.record.partition)
    reader = SegmentReader(path, partition=link.record.partition, display=archive.display(path))
    ceiling = link.ceiling
    for item in reader.items():
        if item.seqno > ceiling:
            return
        yield item


def latest_versions(
    archive: Archive, chain: Sequence[Link], key_filter: re.Pattern[str] | None = None
) -> tuple[dict[bytes, Item], int]:
    """Fold a partition's chain: later versions replace earlier ones; returns (latest, filtered-out)."""
    latest: dict[bytes, Item] = {}
    for link in chain:
        for item in read_link(archive, link):
            latest[item.key] = item
    skipped = 0
    if key_filter is not None:
        kept: dict[bytes, Item] = {}
        for k, item in latest.items():
            if key_filter.search(k.decode("utf-8", "surrogateescape")):
                kept[k] = item
            else:
                skipped += 1
        latest = kept
    return latest, skipped


def plan_partitions(
    archive: Archive,
    runs: Sequence[RunManifest],
    partitions: Iterable[int],
    key_filter: re.Pattern[str] | None = None,
) -> Iterator[tuple[PartitionPlan, int]]:
    """Yield each partition's plan (and how many keys the filter dropped), one at a time."""
    for p in partitions:
        latest, skipped = latest_versions(archive, links(runs, p), key_filter)
        items = sorted(latest.values(), key=lambda i: i.seqno)
        yield PartitionPlan(p, items), skipped


def summarize(
    archive: Archive,
    run_spec: str | None,
    partitions: Iterable[int] | None = None,
    key_filter: re.Pattern[str] | None = None,
) -> PlanSummary:
    """What a restore would do, without contacting a server (``--dry-run``)."""
    target, runs = runs_upto(archive, run_spec)
    parts = sorted(target.partitions) if partitions is None else list(partitions)
    out = PlanSummary(target.run_id)
    for plan, skipped in plan_partitions(archive, runs, parts, key_filter):
        out.partitions[plan.partition] = (plan.sets, plan.deletes)
        out.skipped_keys += skipped
    return out
