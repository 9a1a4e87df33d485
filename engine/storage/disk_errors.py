"""Which operating-system error lies behind a failed LMDB commit.

WHY its own module: the flusher (which keeps retrying and reports a fault) and ``Store.write``
(which refuses one change with ``DiskFull``) must agree on what a full disk looks like.
py-lmdb raises ``DiskError`` for ENOSPC and a plain ``lmdb.Error`` naming the errno's text for
others (EIO: a ``pwrite`` cut short part-way through a commit on a filling disk).
"""
from __future__ import annotations

import errno as errnos
import os

import lmdb

from engine.core.errors import DiskFull

__all__ = ["DISK_ERRNOS", "errno_of"]

#: The errnos that mean "the disk (or quota) refused the bytes", as opposed to a bug.
DISK_ERRNOS = (errnos.ENOSPC, errnos.EDQUOT, errnos.EIO)


def errno_of(exc: BaseException) -> int | None:
    """The errno behind ``exc``, or None if it carries none."""
    if isinstance(exc, DiskFull):
        return exc.errno
    if isinstance(exc, OSError):
        return exc.errno
    if isinstance(exc, lmdb.DiskError):
        return errnos.ENOSPC
    if isinstance(exc, lmdb.Error):
        text = str(exc)
        for number in DISK_ERRNOS:
            if os.strerror(number) in text:
                return number
    return None
