"""``merge``: fold live runs [from, to] into one run so archives do not grow without bound.

Per partition the merged segment keeps, in seqno order:
  * the state at the start of the last source run: the latest version of every key from the
    earlier runs (items above a ceiling, i.e. on a history branch a later run in the range rolled
    back, are dropped: they never count), without tombstones when nothing older can exist for the
    partition (the range starts at seqno 0), since a tombstone with nothing to delete is dead weight;
  * the last source run verbatim, so a future rollback into its range is still restored exactly.
    That run's start is the merged record's ``merge_floor``: a rollback below it is refused loudly
    by ``chain.links`` rather than restored inexactly.

Crash safety: the merged run is built in ``runs/<id>.merging/`` with its manifest (listing
``merged_from``), then the directory is renamed to ``runs/<id>/`` (the commit point), then the
source runs are deleted.  A crash before the rename leaves debris that the next writer deletes; a
crash after it leaves superseded runs that readers ignore and the next writer deletes.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from clients.backup.archive import MANIFEST, MERGING_SUFFIX, Archive, merged_run_id, segment_name
from clients.backup.chain import links
from clients.backup.errors import BackupError, RunNotFound
from clients.backup.fsutil import atomic_rename, atomic_write, fsync_dir
from clients.backup.manifest import PartitionRecord, RunManifest, seal
from clients.backup.plan import read_link
from clients.backup.segment import SegmentWriter
from engine.core.types import Item


def merge(archive: Archive, from_spec: str, to_spec: str,
          progress: Callable[[int, int], None] | None = None) -> RunManifest:
    """Merge under the exclusive lock; returns the new run's manifest."""
    with archive.lock("merge"):
        archive.cleanup()
        runs = archive.runs()
        first, last = archive.find_run(from_spec), archive.find_run(to_spec)
        i, j = runs.index(first), runs.index(last)
        if i > j:
            raise RunNotFound(f"--from {first.run_id} is after --to {last.run_id}")
        if i == j:
            raise RunNotFound(f"--from and --to name the same run {first.run_id}; nothing to merge")
        sources = runs[i : j + 1]
        new_id = merged_run_id(last.run_id)
        tmp = archive.runs_dir / (new_id + MERGING_SUFFIX)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        records: dict[int, PartitionRecord] = {}
        parts = sorted(last.partitions)
        for n, p in enumerate(parts):
            records[p] = _merge_partition(archive, sources, p, tmp)
            if progress:
                progress(n + 1, len(parts))
        manifest = RunManifest(
            run_id=new_id,
            kind="merged",
            started_at=first.started_at,
            finished_at=last.finished_at,
            node_id=last.node_id,
            partition_count=last.partition_count,
            partitions=records,
            server=last.server,
            merged_from=tuple(r.run_id for r in sources) + tuple(x for r in sources for x in r.merged_from),
        )
        atomic_write(tmp / MANIFEST, seal(manifest.to_json()))
        fsync_dir(tmp)
        atomic_rename(tmp, archive.run_dir(new_id))
        archive.cleanup()
        return manifest


def _merge_partition(archive: Archive, sources: list[RunManifest], p: int, out_dir: Path) -> PartitionRecord:
    chain = links(sources, p)
    first_rec, last_rec = chain[0].record, chain[-1].record
    floor = max(last_rec.start.seqno, last_rec.merge_floor)
    # Earlier links' ceilings are <= the last run's start, so this fold is the state at that start.
    folded: dict[bytes, Item] = {}
    for link in chain[:-1]:
        for item in read_link(archive, link):
            folded[item.key] = item
    kept = list(folded.values())
    if first_rec.start.seqno == 0:  # first run, or retaken in full: nothing older counts
        kept = [it for it in kept if not it.deleted]
    kept.extend(read_link(archive, chain[-1]))  # the last run verbatim: exact for rollbacks into it
    kept.sort(key=lambda it: it.seqno)
    start, end = first_rec.start, last_rec.end
    if not kept:
        return PartitionRecord(p, start, end, failover_log=last_rec.failover_log,
                               rollbacks=first_rec.rollbacks, purge_seqno=last_rec.purge_seqno,
                               merge_floor=floor, boundaries=tuple(b for b in last_rec.boundaries if b >= floor))
    path = out_dir / segment_name(p)
    writer = SegmentWriter(path, p)
    writer.snapshot(start.seqno + 1, end.seqno, "merged")
    try:
        writer.add_many(kept)
    except ValueError as exc:  # duplicate seqnos would mean a damaged source that verify missed
        writer.abort()
        raise BackupError(f"partition {p}: cannot merge: {exc}", partition=p) from None
    s = writer.close()
    return PartitionRecord(
        partition=p, start=start, end=end, mutations=s.mutations, deletions=s.deletions,
        segment=path.name, bytes=s.bytes, sha256=s.sha256, blocks=s.blocks,
        first_seqno=s.first_seqno, last_seqno=s.last_seqno, failover_log=last_rec.failover_log,
        rollbacks=first_rec.rollbacks, purge_seqno=last_rec.purge_seqno, merge_floor=floor,
        boundaries=tuple(b for b in last_rec.boundaries if b >= floor),
    )
