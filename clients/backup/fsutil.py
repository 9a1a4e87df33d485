"""Crash-safe file primitives: every file the archive trusts appears whole or not at all.

The pattern is the classic one (write a temp file, fsync it, rename it over the target, fsync
the directory) because a rename is atomic on POSIX but only durable once the directory entry is.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename/create/unlink inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new content.

    ``sync=False`` keeps the all-or-nothing rename but skips both fsyncs: right for records that
    are re-validated before they are trusted (a process crash keeps the page cache anyway)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


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
