"""Crash-safe file primitives: every file the archive trusts appears whole or not at all.

``fsync_dir`` and ``atomic_write`` are the client library's (``clients.files``, also used by the
consumer state and the rollback ring); the archive adds batched fsyncs and durable renames.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clients.files import atomic_write, fsync_dir

__all__ = ["atomic_write", "fsync_dir", "fsync_files", "atomic_rename"]


def fsync_files(paths: Iterable[Path], threads: int = 16) -> None:
    """fsync many files at once: concurrent fsyncs share journal commits, so 64 segments cost
    about what a few sequential fsyncs do."""
    def one(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    paths = list(paths)
    if len(paths) <= 1:
        for p in paths:
            one(p)
        return
    with ThreadPoolExecutor(min(threads, len(paths))) as pool:
        list(pool.map(one, paths))


def atomic_rename(src: Path, dst: Path) -> None:
    """Rename (file or directory) and make the new name durable."""
    os.replace(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)
