"""A real, small filesystem that tests can fill up: a tmpfs mounted under the test's tmp dir.

WHY a real filesystem: a full disk shows itself as ENOSPC, or as EIO when LMDB's ``pwrite`` is cut
short part-way through a commit; neither an LMDB map-size limit (MapFullError, which the engine
grows through) nor a monkeypatched error exercises that path.  Mounting needs root
(CAP_SYS_ADMIN); where that is refused, the tests that need it are skipped with the reason.
"""
from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_CHUNK = b"\0" * (64 << 10)


@contextmanager
def small_tmpfs(where: Path, size_mib: int) -> Iterator[Path]:
    """Mount a ``size_mib`` MiB tmpfs at ``where`` for the block; always unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        # lazy: a process the test killed may still be releasing its files
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write zeros into ``directory/name`` until the filesystem refuses with ENOSPC."""
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                if os.write(fd, _CHUNK) < len(_CHUNK):
                    continue  # a short write: the next one hits ENOSPC
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return path


def free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize
