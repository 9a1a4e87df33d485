"""The archive directory: identity, runs, the lock, and the rules that make it crash-safe.

Layout::

    ARCHIVE/
      archive.json                 keyspace identity (sealed JSON), written once
      .lock                        flock: exclusive for create/merge, shared for readers
      runs/<run_id>/               one directory per run; run ids sort in time order
        manifest.json              written last and atomically: the run's commit point
        p0007.seg                  segment of partition 7 (absent when nothing changed)
        parts/p0007.json           partition 7 finished (lets a killed run resume)
      runs/<run_id>.merging/       a merge being built; renamed to runs/<run_id>/ to commit

A run directory without ``manifest.json`` is *partial*: readers ignore it and the next ``create``
resumes it.  A run listed in a newer complete run's ``merged_from`` is *superseded*: readers ignore
it and writers delete it.  So every crash point leaves an archive whose complete runs are exactly
the committed ones.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from clients.backup.errors import (
    ArchiveLocked,
    ArchiveNotFound,
    CorruptArchive,
    KeyspaceMismatch,
    RunNotFound,
    UnsafeArchivePath,
)
from clients.backup.fsutil import atomic_write, fsync_dir
from clients.backup.manifest import ArchiveMeta, RunManifest, read_sealed, seal
from engine.core.errors import InvalidInput

ARCHIVE_FILE = "archive.json"
MANIFEST = "manifest.json"
RUNS = "runs"
PARTS = "parts"
MERGING_SUFFIX = ".merging"
_RUN_ID = re.compile(r"^\d{8}T\d{12}Z(-m\d+)?$")


def segment_name(partition: int) -> str:
    return f"p{partition:04d}.seg"


def segment_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a segment inside its run directory, or ``None`` when it can.

    Only the name is judged here (no file system): a segment is one plain file name, because the
    manifest that carries it is untrusted input and anything else could reach outside the run."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a file name"
    if not name:
        return "is empty"
    if "\0" in name:
        return "contains a NUL byte"
    if name.startswith(("/", "\\")):
        return "is an absolute path"
    if name in (".", ".."):
        return "names a directory, not a file"
    if "/" in name or "\\" in name:
        return "contains a path separator"
    return None


def run_id_problem(run_id: object) -> str | None:
    """Why ``run_id`` cannot name a run directory (ids are timestamps, never paths), or ``None``."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        return "is not a run id (YYYYMMDDTHHMMSSffffffZ[-mN])"
    return None


def part_name(partition: int) -> str:
    return f"p{partition:04d}.json"


def new_run_id(after: str | None = None, now: float | None = None) -> str:
    """A sortable UTC timestamp id, strictly after ``after`` even if the clock stepped back."""
    t = time.time() if now is None else now
    micros = int(round(t * 1_000_000))
    if after is not None:
        prev = after.split("-m")[0]
        prev_micros = _id_micros(prev)
        micros = max(micros, prev_micros + 1)
    secs, frac = divmod(micros, 1_000_000)
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(secs)) + f"{frac:06d}Z"


def _id_micros(run_id: str) -> int:
    import calendar

    base = run_id.split("-m")[0]
    secs = calendar.timegm(time.strptime(base[:15], "%Y%m%dT%H%M%S"))
    return secs * 1_000_000 + int(base[15:21])


def merged_run_id(to_id: str) -> str:
    """Merged runs sort right after the run they end with, before any later run."""
    base, _, n = to_id.partition("-m")
    return f"{base}-m{int(n or 0) + 1}"


class Archive:
    """An archive directory; construct with ``Archive.open`` (existing) or ``Archive.create``."""

    def __init__(self, root: Path, meta: ArchiveMeta) -> None:
        self.root = root
        self.meta = meta
        self.runs_dir = root / RUNS

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, root: Path | str) -> "Archive":
        root = Path(root)
        path = root / ARCHIVE_FILE
        if not path.exists():
            raise ArchiveNotFound(f"{root} is not a backup archive (no {ARCHIVE_FILE}); run `upr backup create` first")
        meta = ArchiveMeta.from_json(read_sealed(path))
        return cls(root, meta)

    @classmethod
    def open_or_create(cls, root: Path | str, node_id: str, partition_count: int) -> "Archive":
        """Open and check the keyspace, or create a new archive bound to this keyspace."""
        root = Path(root)
        if (root / ARCHIVE_FILE).exists():
            archive = cls.open(root)
            archive.check_keyspace(node_id, partition_count)
            return archive
        if root.exists() and any(p.name not in {".lock", ".write.lock"} for p in root.iterdir()):
            raise ArchiveNotFound(f"{root} exists, is not empty and is not a backup archive; refusing to write into it")
        root.mkdir(parents=True, exist_ok=True)
        (root / RUNS).mkdir(exist_ok=True)
        meta = ArchiveMeta(node_id=node_id, partition_count=partition_count, created_at=time.time())
        atomic_write(root / ARCHIVE_FILE, seal(meta.to_json()))
        fsync_dir(root.parent)
        return cls(root, meta)

    def check_keyspace(self, node_id: str, partition_count: int) -> None:
        if partition_count != self.meta.partition_count:
            raise KeyspaceMismatch(
                f"archive {self.root} holds {self.meta.partition_count} partitions but the server has "
                f"{partition_count}; back up into a new archive"
            )
        if node_id != self.meta.node_id:
            raise KeyspaceMismatch(
                f"archive {self.root} was made from keyspace {self.meta.node_id!r} but the server is "
                f"{node_id!r} (another keyspace, or its data was recreated); back up into a new archive"
            )

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def lock(self, kind: str = "merge") -> Iterator[None]:
        """flock, so a SIGKILLed holder releases it with its process.

        ``read`` (info, verify, restore) shares ``.lock``; ``write`` (create) holds ``.write.lock``
        alone, so readers keep working during a backup (they ignore partial runs); ``merge`` holds
        both, because it deletes the runs readers read."""
        files = {"read": [(".lock", fcntl.LOCK_SH)], "write": [(".write.lock", fcntl.LOCK_EX)],
                 "merge": [(".write.lock", fcntl.LOCK_EX), (".lock", fcntl.LOCK_EX)]}[kind]
        handles = []
        try:
            for name, mode in files:
                fh = open(self.root / name, "a+")
                handles.append(fh)
                try:
                    fcntl.flock(fh.fileno(), mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    what = "a merge" if name == ".lock" else "another backup or merge"
                    raise ArchiveLocked(f"archive {self.root} is in use by {what}; try again when it finishes") from None
            yield
        finally:
            for fh in handles:
                fh.close()

    # ------------------------------------------------------------------ runs
    def run_dir(self, run_id: str) -> Path:
        """The directory of ``run_id``; refuses ids that are paths (they come from manifests too)."""
        problem = run_id_problem(run_id)
        if problem:
            raise UnsafeArchivePath(f"the run id {problem}", archive=str(self.root), run_id=str(run_id))
        return self.runs_dir / run_id

    def _run_ids_on_disk(self) -> list[str]:
        if not self.runs_dir.exists():
            return []
        return sorted(p.name for p in self.runs_dir.iterdir() if p.is_dir() and _RUN_ID.match(p.name))

    def read_manifest(self, run_id: str) -> RunManifest:
        path = self.run_dir(run_id) / MANIFEST
        doc = read_sealed(path, display=str(Path(RUNS) / run_id / MANIFEST))
        try:
            manifest = RunManifest.from_json(doc)
        except (KeyError, TypeError, ValueError, InvalidInput) as exc:
            raise CorruptArchive(f"manifest is malformed ({exc!r})", path=str(path)) from None
        if manifest.run_id != run_id:
            # readers find segments under the manifest's run id: it must be the directory it sits in
            raise UnsafeArchivePath(f"the manifest in runs/{run_id} claims to be run {manifest.run_id!r}",
                                    archive=str(self.root), run_id=run_id)
        return manifest

    def _scan(self) -> tuple[list[RunManifest], list[str], set[str]]:
        complete: list[RunManifest] = []
        partial: list[str] = []
        for run_id in self._run_ids_on_disk():
            if (self.run_dir(run_id) / MANIFEST).exists():
                complete.append(self.read_manifest(run_id))
            else:
                partial.append(run_id)
        superseded = {rid for m in complete for rid in m.merged_from}
        return complete, partial, superseded

    def runs(self) -> list[RunManifest]:
        """Complete, live runs in time order: what restore, verify and incremental create see."""
        complete, _, superseded = self._scan()
        return [m for m in complete if m.run_id not in superseded]

    def partial_runs(self) -> list[str]:
        _, partial, superseded = self._scan()
        return [r for r in partial if r not in superseded]

    def find_run(self, spec: str | None) -> RunManifest:
        """A run by id, unique id prefix, 1-based index, or ``latest`` (``None`` = latest)."""
        runs = self.runs()
        if not runs:
            raise RunNotFound(f"archive {self.root} has no complete run")
        if spec is None or spec == "latest":
            return runs[-1]
        if spec.isdigit() and len(spec) < 8:
            idx = int(spec)
            if 1 <= idx <= len(runs):
                return runs[idx - 1]
            raise RunNotFound(f"run index {idx} out of range 1..{len(runs)}")
        matches = [m for m in runs if m.run_id == spec] or [m for m in runs if m.run_id.startswith(spec)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise RunNotFound(f"no complete run {spec!r} in {self.root} (see `upr backup info`)")
        raise RunNotFound(f"run {spec!r} is ambiguous: {', '.join(m.run_id for m in matches)}")

    def cleanup(self) -> list[str]:
        """Delete superseded runs and abandoned merges (writers only, under the exclusive lock)."""
        removed: list[str] = []
        complete, _, superseded = self._scan()
        for rid in sorted(superseded):
            if self.run_dir(rid).exists():
                shutil.rmtree(self.run_dir(rid))
                removed.append(rid)
        if self.runs_dir.exists():
            for p in self.runs_dir.iterdir():
                if p.name.endswith(MERGING_SUFFIX):
                    shutil.rmtree(p)
                    removed.append(p.name)
        if removed:
            fsync_dir(self.runs_dir)
        return removed

    def segment_path(self, run_id: str, segment: str, *, partition: int | None = None) -> Path:
        """The segment file a manifest names, refused unless it stays inside the run directory.

        The name is checked first (no separators, no ``..``, not absolute); then the path is
        resolved, so neither the segment nor its run directory can be a symlink to somewhere
        else: an archive cannot point a reader at another file however it was built or copied."""
        rdir = self.run_dir(run_id)
        problem = segment_name_problem(segment)
        if problem:
            raise UnsafeArchivePath(f"the name {problem}", archive=str(self.root), run_id=run_id,
                                    segment=str(segment), partition=partition)
        path = rdir / segment
        real = path.resolve()
        if real.parent != self.runs_dir.resolve() / run_id:
            raise UnsafeArchivePath(f"it resolves to {real}, outside the run directory (a symlink)",
                                    archive=str(self.root), run_id=run_id, segment=segment, partition=partition)
        return path

    def display(self, path: Path) -> str:
        """Paths in messages are relative to the archive root: what a user can `ls`."""
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)


def disk_usage(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, f))
    return total
