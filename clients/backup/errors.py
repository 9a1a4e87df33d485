"""The backup client's error tree.

    UprError (engine.core.errors)
    └── BackupError                 base of everything the backup tool raises on purpose
        ├── ArchiveError            the archive on disk is missing, foreign or damaged
        │   ├── ArchiveNotFound     no archive.json where one was expected
        │   ├── ArchiveLocked       another backup/merge holds the archive lock
        │   ├── KeyspaceMismatch    the server is not the keyspace this archive was made from
        │   ├── CorruptArchive      a manifest or segment fails its checksum or framing
        │   │                       (``path`` and ``offset`` say exactly where)
        │   │   └── UnsafeArchivePath  a manifest names a run or segment outside its run directory
        │   └── ContinuityError     seqno ranges of one partition do not chain across runs
        ├── RunNotFound             ``--run/--from/--to`` names no complete run
        ├── StreamFailed            a partition's stream ended without reaching its end seqno
        └── RestoreFailed           the server refused a restored item (partition, seqno, key)

Server-side failures (unreachable, HTTP errors) keep the client library's types
(``clients.errors.ConnectionFailed``, ``HttpError``, ...).

Each error carries ``partition``/``seqno`` (from ``UprError``) and, for damage, the file and byte
offset, so a message never has to be parsed to know what to fix.
"""
from __future__ import annotations

from engine.core.errors import UprError


class BackupError(UprError):
    code = "backup_error"


class ArchiveError(BackupError):
    code = "archive_error"


class ArchiveNotFound(ArchiveError):
    code = "archive_not_found"


class ArchiveLocked(ArchiveError):
    code = "archive_locked"
    retriable = True


class KeyspaceMismatch(ArchiveError):
    code = "keyspace_mismatch"


class CorruptArchive(ArchiveError):
    """Damage found on disk; ``path`` and ``offset`` locate the first bad byte range."""

    code = "corrupt_archive"

    def __init__(
        self,
        message: str,
        *,
        path: str,
        offset: int | None = None,
        partition: int | None = None,
        seqno: int | None = None,
    ) -> None:
        where = path if offset is None else f"{path} at offset {offset}"
        super().__init__(f"{where}: {message}", partition=partition, seqno=seqno)
        self.path = path
        self.offset = offset

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        out["path"] = self.path
        if self.offset is not None:
            out["offset"] = self.offset
        return out


class UnsafeArchivePath(CorruptArchive):
    """A manifest names a file outside its run directory; refused before anything is opened.

    Archives travel (copied from object stores, handed over for restore), so a manifest is input
    like any other: a segment name such as ``../../etc/passwd`` or a symlink out of the run
    would otherwise make ``verify`` and ``restore`` read whatever file it points at."""

    code = "unsafe_archive_path"

    def __init__(self, reason: str, *, archive: str, run_id: str, segment: str | None = None,
                 partition: int | None = None) -> None:
        what = f"run {run_id!r}" if segment is None else f"run {run_id!r}, segment {segment!r}"
        super().__init__(f"{what} refused: {reason}", path=archive, partition=partition)
        self.archive = archive
        self.run_id = run_id
        self.segment = segment

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        out["archive"] = self.archive
        out["run_id"] = self.run_id
        if self.segment is not None:
            out["segment"] = self.segment
        return out


class ContinuityError(ArchiveError):
    code = "continuity_error"


class RunNotFound(BackupError):
    code = "run_not_found"


class StreamFailed(BackupError):
    code = "stream_failed"
    retriable = True


class RestoreFailed(BackupError):
    code = "restore_failed"

    def __init__(self, message: str, *, key: str | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.key = key
