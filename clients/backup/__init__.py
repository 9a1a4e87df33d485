"""The upr backup client: full and incremental backups from the change stream, verify, merge, restore.

Model: Couchbase's cbbackupmgr (per-partition seqno ranges taken from the stream), with the
failover-aware parts it lacks (narrow rollbacks, verify without restore, automatic resume).
The archive format and its crash-safety rules are described in ``clients/backup/README.md`` and
in the docstrings of ``archive``, ``segment``, ``runwriter``, ``chain`` and ``rollbacks``.

Command line: ``upr backup create|info|verify|restore|merge`` (``clients.backup.cli.register``).
"""
from __future__ import annotations

from clients.backup.archive import Archive
from clients.backup.create import CreateResult, create_backup
from clients.backup.errors import (
    ArchiveError,
    ArchiveLocked,
    ArchiveNotFound,
    BackupError,
    ContinuityError,
    CorruptArchive,
    KeyspaceMismatch,
    RestoreFailed,
    RunNotFound,
    StreamFailed,
)
from clients.backup.info import archive_info
from clients.backup.manifest import PartitionRecord, RollbackRecord, RunManifest
from clients.backup.merge import merge
from clients.backup.plan import summarize
from clients.backup.restore import RestoreReport, restore
from clients.backup.verify import VerifyReport, verify

__all__ = [
    "Archive",
    "ArchiveError",
    "ArchiveLocked",
    "ArchiveNotFound",
    "BackupError",
    "ContinuityError",
    "CorruptArchive",
    "CreateResult",
    "KeyspaceMismatch",
    "PartitionRecord",
    "RestoreFailed",
    "RestoreReport",
    "RollbackRecord",
    "RunManifest",
    "RunNotFound",
    "StreamFailed",
    "VerifyReport",
    "archive_info",
    "create_backup",
    "merge",
    "restore",
    "summarize",
    "verify",
]
