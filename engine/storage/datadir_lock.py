"""The data-dir lock: one engine per data dir.

Why: seqnos are allocated in memory, so two engines on one data dir (two processes, or the same
process twice, which LMDB forbids too) would hand out the same seqnos.  An exclusive ``flock``
on ``<data_dir>/upr.lock`` held for as long as the store is open prevents it, and the kernel
drops the lock when the process dies, so a SIGKILLed server never leaves it stale.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from engine.storage.errors import DataDirInUse

LOCK_FILE = "upr.lock"


def lock_data_dir(data_dir: Path) -> int:
    """Take the exclusive lock of ``data_dir`` and return its file descriptor (closing it
    releases the lock); raise ``DataDirInUse`` when another engine holds it."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(f"data dir {data_dir} is already open by another engine", field="data_dir") from None
    return fd


def unlock_data_dir(fd: int) -> None:
    """Release the lock taken by ``lock_data_dir``."""
    os.close(fd)
