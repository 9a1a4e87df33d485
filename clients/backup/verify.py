"""``verify``: re-read every byte the archive relies on, without a server.

Checks, per live run: the sealed manifest; per segment the file length and sha256 recorded in the
manifest, every block and record CRC/framing, seqnos strictly increasing and inside the record's
(start, end] range, items inside the snapshot that announced them, and the mutation/deletion
counts.  Per partition across runs: ranges chain (``chain.continuity_problems``) and rollbacks are
consistent.  Every problem is collected (not just the first), each naming file and offset or
partition and seqno.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from clients.backup.archive import Archive
from clients.backup.chain import continuity_problems
from clients.backup.errors import BackupError, CorruptArchive
from clients.backup.manifest import PartitionRecord
from clients.backup.segment import SegmentReader, SnapshotMarker
from engine.protocol.client.offset import StreamOffset


@dataclass(slots=True)
class VerifyReport:
    runs: int = 0
    segments: int = 0
    items: int = 0
    bytes: int = 0
    problems: list[BackupError] = field(default_factory=list)
    partial_runs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_segment(archive: Archive, run_id: str, rec: PartitionRecord) -> tuple[int, int]:
    """Check one segment fully; raise the first problem.  Returns (items, bytes)."""
    assert rec.segment is not None
    p = rec.partition
    path = archive.segment_path(run_id, rec.segment, partition=p)
    display = archive.display(path)
    if not path.exists():
        raise CorruptArchive("segment file is missing", path=display, partition=p)
    size = path.stat().st_size
    if size != rec.bytes:
        raise CorruptArchive(f"file is {size} bytes, the manifest says {rec.bytes}", path=display,
                             offset=min(size, rec.bytes), partition=p)
    sha = hashlib.sha256()
    reader = SegmentReader(path, partition=p, display=display)
    last = rec.start.seqno
    snap_start, snap_end = -1, -1
    mutations = deletions = 0
    for r in reader.records(sha):
        if isinstance(r, SnapshotMarker):
            # after a reconnect a stream re-announces the rest of a partly received snapshot, so a
            # marker may overlap the previous one; it never covers an item already archived
            if r.start > r.end or r.start <= last and last > rec.start.seqno:
                raise CorruptArchive(f"snapshot {r.start}..{r.end} does not follow seqno {last}",
                                     path=display, partition=p, seqno=r.start)
            snap_start, snap_end = r.start, r.end
            continue
        if isinstance(r, StreamOffset):  # a checkpoint (the reader checked snap_start <= seqno <= snap_end)
            if r.seqno < last or r.seqno > rec.end.seqno:
                raise CorruptArchive(f"checkpoint at seqno {r.seqno} outside {last}..{rec.end.seqno}",
                                     path=display, partition=p, seqno=r.seqno)
            continue
        if r.seqno <= last:
            raise CorruptArchive(f"seqno {r.seqno} does not follow {last}", path=display, partition=p, seqno=r.seqno)
        if r.seqno > rec.end.seqno:
            raise CorruptArchive(f"seqno {r.seqno} beyond the run's end {rec.end.seqno}", path=display,
                                 partition=p, seqno=r.seqno)
        if not (snap_start <= r.seqno <= snap_end):
            raise CorruptArchive(f"seqno {r.seqno} outside its snapshot {snap_start}..{snap_end}", path=display,
                                 partition=p, seqno=r.seqno)
        last = r.seqno
        if r.deleted:
            deletions += 1
        else:
            mutations += 1
    if (mutations, deletions) != (rec.mutations, rec.deletions):
        raise CorruptArchive(
            f"holds {mutations} mutations and {deletions} deletions, the manifest says "
            f"{rec.mutations} and {rec.deletions}", path=display, partition=p)
    if rec.sha256 and sha.hexdigest() != rec.sha256:
        raise CorruptArchive("sha256 differs from the manifest", path=display, partition=p)
    return mutations + deletions, size


def verify(archive: Archive, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    report = VerifyReport()
    try:
        runs = archive.runs()
    except BackupError as exc:
        report.problems.append(exc)
        return report
    report.runs = len(runs)
    report.partial_runs = archive.partial_runs()
    work = [(run.run_id, rec) for run in runs for rec in run.partitions.values() if rec.segment]
    for n, (run_id, rec) in enumerate(work):
        try:
            items, size = verify_segment(archive, run_id, rec)
            report.items += items
            report.bytes += size
            report.segments += 1
        except BackupError as exc:
            report.problems.append(exc)
        if progress:
            progress(n + 1, len(work))
    for p in range(archive.meta.partition_count):
        report.problems.extend(continuity_problems(runs, p))
    return report
