"""Crash-safe file primitives shared by the consumer state, the rollback ring and the backup archive.

The pattern is the classic one (write a temp file, fsync it, rename it over the target, fsync the
directory) because a rename is atomic on POSIX but only durable once the directory entry is: a
crash at any instant leaves either the old or the new content, never half of one.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "atomic_write"]


def fsync_dir(path: Path) -> None:
    """Make a rename/create/unlink inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, sync: bool = True, tmp: Path | None = None) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new content.

    ``sync=False`` keeps the all-or-nothing rename but skips both fsyncs: right for records that
    are re-validated before they are trusted (a process crash keeps the page cache anyway).
    ``tmp`` names the temp file (default ``.<name>.tmp`` beside ``path``), for owners that sweep
    stale temp files a killed writer left."""
    tmp = tmp if tmp is not None else path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)
