"""Writing one run: per-partition segments, per-partition commit records, the manifest last.

Crash safety, step by step (any step may be the last one before SIGKILL):

1. ``runs/<id>/`` is created and ``run.json`` (kind, start time, server) written atomically.
   A directory without ``run.json`` is debris and is deleted by the next writer.
2. Partition p streams into ``pNNNN.seg``; each completed snapshot appends a checkpoint record.
   A killed run's unfinished segment is adopted by the next run up to its last checkpoint that
   survived (``PartitionWriter.adopt``), so streaming continues there, not from the start.
3. ``parts/pNNNN.json`` (its range, counts, length, sha256) is written with an atomic rename:
   partition p of this run is done and survives a process crash.  It is not fsynced (64 partitions
   x 3 fsyncs dominated small incremental runs): instead a resumed run re-checks every adopted
   segment's length and sha256 against its record and retakes any partition that does not match,
   so even a power cut cannot make a resumed run trust a torn segment.
4. When every partition is done, all segments are fsynced (concurrently), then ``manifest.json``
   (all records) is written atomically and fsynced: the run is complete and durable.  Readers see
   only runs with a manifest.

So a killed run loses at most each unfinished partition's last incomplete snapshot; the next
``create`` finds the partial run, keeps the finished partitions and continues the others.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from clients.backup.archive import MANIFEST, PARTS, Archive, new_run_id, part_name, segment_name
from clients.backup.errors import BackupError, CorruptArchive
from clients.backup.fsutil import atomic_write, fsync_dir, fsync_files
from clients.backup.manifest import MAX_BOUNDARIES, PartitionRecord, RollbackRecord, RunManifest, read_sealed, seal
from clients.backup.segment import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_LEVEL,
    SegmentReader,
    SegmentWriter,
    SnapshotMarker,
)
from engine.core.errors import InvalidInput
from engine.core.types import Item
from engine.protocol.client.offset import StreamOffset

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
        #: where the stream must continue when a killed run's work was adopted (``adopt``)
        self.resume_offset: StreamOffset | None = None
        self._snap: tuple[int, int] | None = None  # the snapshot being received
        self.restarts: list[tuple[int, int]] = []  # in-run rollbacks: (server point, cut back to)

    @property
    def path(self) -> Path:
        return self.run.dir / segment_name(self.partition)

    @property
    def _start_file(self) -> Path:
        return self.run.parts_dir / f"p{self.partition:04d}.start.json"

    def adopt(self) -> StreamOffset | None:
        """Keep what a killed run streamed for this partition, up to its last checkpoint.

        The segment is copied up to the last checkpoint record that survived (a torn tail is cut
        at the first damaged block); the stream continues from that position, which may lie
        inside a snapshot (DCP resumes there; a changed history makes the server roll back).  If
        the killed run had moved this partition's start (a rollback), ``pNNNN.start.json`` says
        so; without a readable one for a moved start nothing is adopted."""
        if not self.path.exists():
            return None
        old = self.path.with_name(self.path.name + ".old")
        self.path.replace(old)
        original = self.start
        adopted = False
        try:
            if self._start_file.exists():
                doc = read_sealed(self._start_file)
                self.start = StreamOffset.from_dict(doc["start"])
                self.rollbacks = [RollbackRecord.from_json(r) for r in doc["rollbacks"]]
                self._last = self.start.seqno
                self.boundaries = [self.start.seqno]
            reader = SegmentReader(old, partition=self.partition)
            last_ck = None
            for rec in reader.salvage():
                if isinstance(rec, StreamOffset):
                    last_ck = rec
            if last_ck is None or last_ck.seqno <= self.start.seqno:
                return None
            new = self._segment()
            for rec in reader.salvage():
                if isinstance(rec, SnapshotMarker):
                    new.snapshot(rec.start, rec.end, rec.source)
                elif isinstance(rec, StreamOffset):
                    new.checkpoint(rec)
                    if rec.complete and rec.seqno > self.boundaries[-1]:
                        self.boundaries.append(rec.seqno)
                    if rec == last_ck:
                        break
                else:
                    new.add(rec)
                    self._last = rec.seqno
            self.resume_offset = last_ck
            self._snap = None if last_ck.complete else (last_ck.snap_start, last_ck.snap_end)
            adopted = True
            return self.resume_offset
        except (CorruptArchive, KeyError, TypeError, ValueError, InvalidInput, OSError):
            return None
        finally:
            old.unlink(missing_ok=True)
            if not adopted:  # start over from where the previous run ended
                self.abort()
                self._start_file.unlink(missing_ok=True)
                self.start, self.rollbacks, self._last, self.boundaries = original, [], original.seqno, [original.seqno]

    def _segment(self) -> SegmentWriter:
        if self._seg is None:
            self._seg = SegmentWriter(self.path, self.partition, block_bytes=self.run.block_bytes,
                                      level=self.run.level, background=True)
        return self._seg

    def snapshot(self, start: int, end: int, source: str) -> None:
        self._segment().snapshot(start, end, source)
        self._snap = (start, end)

    def checkpoint(self, uuid: int) -> None:
        """Record the stream position after what was written so far (after each item batch)."""
        if self._snap is not None and self._last > self.boundaries[-1]:
            start, end = self._snap
            self._segment().checkpoint(StreamOffset(uuid, self._last, min(start, self._last), end))

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

    def snapshot_complete(self, end: int, uuid: int | None = None, snap_start: int = 0) -> None:
        """The snapshot ending at ``end`` is complete; with ``uuid`` a checkpoint record lets a
        killed run resume right here."""
        if end > self.boundaries[-1]:
            self.boundaries.append(end)
            if uuid is not None:
                self._segment().checkpoint(StreamOffset(uuid, end, min(snap_start, end), end))
        self._snap = None

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
            elif isinstance(rec, StreamOffset):
                new.checkpoint(rec)
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
        # a killed run must not adopt this segment as if it started where the previous run ended
        atomic_write(self._start_file, seal({"start": new_start.to_dict(),
                                             "rollbacks": [r.to_json() for r in self.rollbacks]}), sync=False)

    def abort(self) -> None:
        if self._seg is not None:
            self._seg.abort()
            self._seg = None

    def suspend(self) -> None:
        """The run failed: write out what was streamed (checkpoints included) for the next run to
        adopt, instead of throwing it away."""
        if self._seg is not None:
            self._seg.close(sync=False)
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
            restarts=tuple(self.restarts),
        )
        self.run.commit_partition(rec)
        self._start_file.unlink(missing_ok=True)
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
              level: int = DEFAULT_LEVEL, full: bool = False) -> "RunWriter":
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
        info = {"run_id": run_id, "kind": "incremental" if runs and not full else "full",
                "started_at": time.time(), "server": server, "resumed": 0, "forced_full": bool(full and runs)}
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
        for f in sorted(parts.glob("p[0-9][0-9][0-9][0-9].json")):  # not the pNNNN.start.json sidecars
            try:
                rec = PartitionRecord.from_json(read_sealed(f, display=archive.display(f)))
                if rec.segment is not None:
                    _check_segment(archive.segment_path(run_id, rec.segment, partition=rec.partition), rec)
            except (CorruptArchive, KeyError, TypeError, ValueError, OSError, InvalidInput):
                f.unlink()
                continue
            done[rec.partition] = rec
        return done

    @staticmethod
    def _drop_uncommitted(rdir: Path, done: dict[int, PartitionRecord]) -> None:
        """Debris of a killed run goes; unfinished segments stay for ``PartitionWriter.adopt``."""
        for f in rdir.glob("p*.seg.*"):
            f.unlink()
        for p in done:
            (rdir / PARTS / f"p{p:04d}.start.json").unlink(missing_ok=True)

    @property
    def kind(self) -> str:
        return str(self.info["kind"])

    def partition(self, partition: int, start: StreamOffset) -> PartitionWriter:
        if partition in self.done:
            raise BackupError(f"partition {partition} is already done in run {self.run_id}", partition=partition)
        w = PartitionWriter(self, partition, start)
        w.adopt()  # what a killed run already streamed, up to its last checkpoint
        return w

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
