"""Writing one run: per-partition segments, per-partition commit records, the manifest last.

Crash safety, step by step (any step may be the last one before SIGKILL):

1. ``runs/<id>/`` is created and ``run.json`` (kind, start time, server) written atomically.
   A directory without ``run.json`` is debris and is deleted by the next writer.
2. Partition p streams into ``pNNNN.seg``.  Until step 3 the file is untrusted.
3. ``parts/pNNNN.json`` (its range, counts, length, sha256) is written with an atomic rename:
   partition p of this run is done and survives a process crash.  It is not fsynced (64 partitions
   x 3 fsyncs dominated small incremental runs): instead a resumed run re-checks every adopted
   segment's length and sha256 against its record and retakes any partition that does not match,
   so even a power cut cannot make a resumed run trust a torn segment.
4. When every partition is done, all segments are fsynced (concurrently), then ``manifest.json``
   (all records) is written atomically and fsynced: the run is complete and durable.  Readers see
   only runs with a manifest.

So a killed run loses at most the partitions that were mid-stream; the next ``create`` finds the
partial run, keeps the finished partitions and streams only the others (``resume``).
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from clients.backup.archive import MANIFEST, PARTS, Archive, new_run_id, part_name, segment_name
from clients.backup.errors import BackupError, CorruptArchive
from clients.backup.fsutil import atomic_write, fsync_dir, fsync_files
from clients.backup.manifest import MAX_BOUNDARIES, PartitionRecord, RollbackRecord, RunManifest, read_sealed, seal
from clients.backup.segment import DEFAULT_BLOCK_BYTES, DEFAULT_LEVEL, SegmentReader, SegmentWriter, SnapshotMarker
from clients.offset import StreamOffset
from engine.errors import InvalidInput
from engine.types import Item

RUN_FILE = "run.json"


class PartitionWriter:
    """One partition of one run: segment plus the bookkeeping that becomes its record."""

    def __init__(self, run: "RunWriter", partition: int, start: StreamOffset) -> None:
        self.run = run
        self.partition = partition
        self.start = start
        self.rollbacks: list[RollbackRecord] = []
        self._seg: SegmentWriter | None = None
        self._last = start.seqno
        #: seqnos at which this run holds an exact state: its start and every complete snapshot's end
        #: (inside a deduplicated snapshot older versions are missing, so only these are safe cut points)
        self.boundaries: list[int] = [start.seqno]

    @property
    def path(self) -> Path:
        return self.run.dir / segment_name(self.partition)

    def _segment(self) -> SegmentWriter:
        if self._seg is None:
            self._seg = SegmentWriter(self.path, self.partition, block_bytes=self.run.block_bytes,
                                      level=self.run.level, background=True)
        return self._seg

    def snapshot(self, start: int, end: int, source: str) -> None:
        self._segment().snapshot(start, end, source)

    def add(self, item: Item) -> None:
        if item.seqno <= self.start.seqno:
            raise BackupError(
                f"partition {self.partition}: received seqno {item.seqno}, not after the stream start "
                f"{self.start.seqno}", partition=self.partition, seqno=item.seqno)
        self._segment().add(item)
        self._last = item.seqno

    def add_many(self, items: list[Item]) -> None:
        seg = self._segment()
        if items and items[0].seqno <= self.start.seqno:
            self.add(items[0])  # raises with the partition and seqno
        seg.add_many(items)
        if items:
            self._last = items[-1].seqno

    def add_columns(self, keys: list[bytes], seqnos: "list[int]", cas: "list[int]", revs: "list[int]",
                    deleted: bytes, values: list[bytes]) -> None:
        if seqnos and seqnos[0] <= self.start.seqno:
            raise BackupError(
                f"partition {self.partition}: received seqno {seqnos[0]}, not after the stream start "
                f"{self.start.seqno}", partition=self.partition, seqno=seqnos[0])
        try:
            self._segment().add_columns(keys, seqnos, cas, revs, deleted, values)
        except ValueError as exc:
            raise BackupError(str(exc), partition=self.partition, seqno=seqnos[0]) from None
        if seqnos:
            self._last = seqnos[-1]

    def snapshot_complete(self, end: int) -> None:
        if end > self.boundaries[-1]:
            self.boundaries.append(end)

    def boundary_at_or_below(self, seqno: int) -> int:
        return max(b for b in self.boundaries if b <= seqno)

    def truncate(self, seqno: int) -> None:
        """Keep only what this run took up to ``seqno`` (a rollback that stays inside this run's range:
        the stream resumes from ``seqno``, so later items of ours are on an abandoned branch).
        ``seqno`` must be one of ``boundaries`` for the result to be an exact state."""
        self.boundaries = [b for b in self.boundaries if b <= seqno] or [self.start.seqno]
        if self._seg is None:
            return
        self._seg.close(sync=False)
        old = self.path.with_name(self.path.name + ".old")
        self.path.replace(old)
        self._seg = None
        new = self._segment()
        last = self.start.seqno
        for rec in SegmentReader(old, partition=self.partition).records():
            if isinstance(rec, SnapshotMarker):
                if rec.start > seqno:
                    break
                new.snapshot(rec.start, min(rec.end, seqno), rec.source)
            elif rec.seqno > seqno:
                break
            else:
                new.add(rec)
                last = rec.seqno
        old.unlink()
        self._last = last

    def rollback(self, requested: StreamOffset, to_seqno: int, new_start: StreamOffset, reason: str = "") -> None:
        """The server refused ``requested``: drop what this run took and start again at ``new_start``."""
        if self._seg is not None:
            self._seg.abort()
            self._seg = None
        self.rollbacks.append(RollbackRecord(requested, to_seqno, reason))
        self.start = new_start
        self._last = new_start.seqno
        self.boundaries = [new_start.seqno]

    def abort(self) -> None:
        if self._seg is not None:
            self._seg.abort()
            self._seg = None

    def finish(self, end: StreamOffset, *, failover_log: tuple[tuple[int, int], ...] = (),
               purge_seqno: int = 0) -> PartitionRecord:
        """Seal the segment and commit this partition (step 3 of the module docstring)."""
        if end.seqno < self._last:
            raise BackupError(f"partition {self.partition}: end seqno {end.seqno} is before the last item "
                              f"{self._last}", partition=self.partition, seqno=end.seqno)
        segment = None
        summary = None
        if self._seg is not None:
            summary = self._seg.close(sync=False)  # fsynced with the others at commit
            self._seg = None
            if summary.mutations + summary.deletions == 0:
                self.path.unlink()  # markers only: nothing to restore
                summary = None
            else:
                segment = self.path.name
        rec = PartitionRecord(
            partition=self.partition,
            start=self.start,
            end=end,
            mutations=summary.mutations if summary else 0,
            deletions=summary.deletions if summary else 0,
            segment=segment,
            bytes=summary.bytes if summary else 0,
            sha256=summary.sha256 if summary else None,
            blocks=summary.blocks if summary else 0,
            first_seqno=summary.first_seqno if summary else 0,
            last_seqno=summary.last_seqno if summary else 0,
            failover_log=failover_log,
            rollbacks=tuple(self.rollbacks),
            purge_seqno=purge_seqno,
            boundaries=tuple(b for b in self.boundaries if b <= end.seqno)[-MAX_BOUNDARIES:],
        )
        self.run.commit_partition(rec)
        return rec


class RunWriter:
    """A run in progress (new or resumed).  Use ``begin``; then ``partition(...)`` per partition to
    take, ``finish`` each, and ``commit`` once all are done."""

    def __init__(self, archive: Archive, run_id: str, info: dict[str, object], done: dict[int, PartitionRecord],
                 *, resumed: bool, block_bytes: int = DEFAULT_BLOCK_BYTES, level: int = DEFAULT_LEVEL) -> None:
        self.archive = archive
        self.run_id = run_id
        self.info = info
        self.done = done
        self.resumed = resumed
        self.block_bytes = block_bytes
        self.level = level
        self.dir = archive.run_dir(run_id)
        self.parts_dir = self.dir / PARTS

    @classmethod
    def begin(cls, archive: Archive, *, server: str = "", block_bytes: int = DEFAULT_BLOCK_BYTES,
              level: int = DEFAULT_LEVEL) -> "RunWriter":
        """Resume the partial run if there is one, else start a new one.  Caller holds the lock."""
        archive.cleanup()
        partial = archive.partial_runs()
        for run_id in partial[:-1]:
            shutil.rmtree(archive.run_dir(run_id))  # only the newest partial run can be resumed
        if partial:
            run_id = partial[-1]
            rdir = archive.run_dir(run_id)
            try:
                info = read_sealed(rdir / RUN_FILE, display=archive.display(rdir / RUN_FILE))
            except (FileNotFoundError, CorruptArchive):
                shutil.rmtree(rdir)  # died before step 1 finished: debris
            else:
                done = cls._read_done(archive, run_id)
                cls._drop_uncommitted(rdir, done)
                info["resumed"] = int(info.get("resumed", 0)) + 1  # type: ignore[call-overload]
                atomic_write(rdir / RUN_FILE, seal(info))
                return cls(archive, run_id, info, done, resumed=True, block_bytes=block_bytes, level=level)
        runs = archive.runs()
        run_id = new_run_id(after=max([r.run_id for r in runs] + partial, default=None))
        rdir = archive.run_dir(run_id)
        (rdir / PARTS).mkdir(parents=True)
        info = {"run_id": run_id, "kind": "incremental" if runs else "full", "started_at": time.time(),
                "server": server, "resumed": 0}
        atomic_write(rdir / RUN_FILE, seal(info))
        fsync_dir(archive.runs_dir)
        return cls(archive, run_id, info, {}, resumed=False, block_bytes=block_bytes, level=level)

    @staticmethod
    def _read_done(archive: Archive, run_id: str) -> dict[int, PartitionRecord]:
        done: dict[int, PartitionRecord] = {}
        parts = archive.run_dir(run_id) / PARTS
        if not parts.exists():
            parts.mkdir()
            return done
        for f in sorted(parts.glob("p*.json")):
            try:
                rec = PartitionRecord.from_json(read_sealed(f, display=archive.display(f)))
                if rec.segment is not None:
                    _check_segment(archive.run_dir(run_id) / rec.segment, rec)
            except (CorruptArchive, KeyError, TypeError, ValueError, OSError, InvalidInput):
                f.unlink()
                continue
            done[rec.partition] = rec
        return done

    @staticmethod
    def _drop_uncommitted(rdir: Path, done: dict[int, PartitionRecord]) -> None:
        keep = {rec.segment for rec in done.values() if rec.segment}
        for f in rdir.glob("p*.seg*"):
            if f.name not in keep:
                f.unlink()

    @property
    def kind(self) -> str:
        return str(self.info["kind"])

    def partition(self, partition: int, start: StreamOffset) -> PartitionWriter:
        if partition in self.done:
            raise BackupError(f"partition {partition} is already done in run {self.run_id}", partition=partition)
        seg = self.dir / segment_name(partition)
        seg.unlink(missing_ok=True)
        return PartitionWriter(self, partition, start)

    def commit_partition(self, rec: PartitionRecord) -> None:
        atomic_write(self.parts_dir / part_name(rec.partition), seal(rec.to_json()), sync=False)
        self.done[rec.partition] = rec

    def commit(self, node_id: str, partition_count: int) -> RunManifest:
        missing = sorted(set(range(partition_count)) - set(self.done))
        if missing:
            raise BackupError(f"run {self.run_id} cannot be committed: partitions {missing[:10]} not done",
                              partition=missing[0])
        manifest = RunManifest(
            run_id=self.run_id,
            kind=self.kind,
            started_at=float(self.info["started_at"]),  # type: ignore[arg-type]
            finished_at=time.time(),
            node_id=node_id,
            partition_count=partition_count,
            partitions=dict(sorted(self.done.items())),
            server=str(self.info.get("server", "")),
            resumed=int(self.info.get("resumed", 0)),  # type: ignore[call-overload]
        )
        fsync_files(self.dir / rec.segment for rec in self.done.values() if rec.segment)
        fsync_dir(self.dir)
        atomic_write(self.dir / MANIFEST, seal(manifest.to_json()))
        return manifest


def _check_segment(path: Path, rec: PartitionRecord) -> None:
    """A committed-but-unsynced segment must match its record byte for byte before it is reused."""
    import hashlib

    if path.stat().st_size != rec.bytes:
        raise CorruptArchive("segment length differs from its part record", path=str(path))
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha.update(chunk)
    if sha.hexdigest() != rec.sha256:
        raise CorruptArchive("segment sha256 differs from its part record", path=str(path))
