"""Where a consumer keeps its state (``ConsumerState``, defined with its JSON form in the pure layer:
``engine.protocol.client.checkpoint``).

``StateStore`` is the narrow pluggable interface (etcd raft's ``Storage`` habit): ``load`` and
``save``, with ``MemoryStateStore`` for tests and throwaway consumers and ``FileStateStore`` as the
durable default.  ``FileStateStore`` writes atomically: write a temp file, fsync it, rename it over
the old one, fsync the directory; a crash at any instant leaves either the old or the new file,
never a half-written one.  It also names where the rollback ring lives (same directory), so one
directory holds everything a consumer needs to resume.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from engine.protocol.client.checkpoint import STATE_VERSION, ConsumerState, PartitionCheckpoint

from .errors import UsageError
from .files import atomic_write

__all__ = ["PartitionCheckpoint", "ConsumerState", "StateStore", "MemoryStateStore", "FileStateStore", "STATE_VERSION"]

STATE_FILE = "state.json"
LOCK_FILE = "lock"


@runtime_checkable
class StateStore(Protocol):
    """Where a consumer keeps its state.  ``save`` must be atomic: readers see old or new, never a mix."""

    #: Directory for the durable rollback ring, or None to keep the ring in memory only.
    ring_directory: Path | None

    def load(self) -> ConsumerState | None: ...

    def save(self, state: ConsumerState) -> None: ...


class MemoryStateStore:
    """Keeps the state in this process only (tests, throwaway consumers)."""

    ring_directory: Path | None = None

    def __init__(self, state: ConsumerState | None = None) -> None:
        self.state = state
        self.saves = 0

    def load(self) -> ConsumerState | None:
        return self.state

    def save(self, state: ConsumerState) -> None:
        self.state = state
        self.saves += 1


class FileStateStore:
    """Durable state in ``directory/state.json`` (atomic replace) and the ring in ``directory/ring.log``.

    The directory is locked (``flock`` on ``directory/lock``) from the first ``load``/``save`` until
    ``close()`` or the process ends (the kernel drops the lock even on SIGKILL): two consumers
    sharing one state directory would each save positions the other's ring does not match."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / STATE_FILE
        self.ring_directory: Path | None = self.directory
        self.saves = 0
        self._lock_fd: int | None = None

    def acquire(self) -> None:
        """Lock the directory now (``load``/``save`` do it anyway); ``UsageError`` if taken."""
        if self._lock_fd is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(f"{self.directory} is in use by another consumer (one state directory per consumer)",
                             field="state") from None
        self._lock_fd = fd
        for stale in self.directory.glob(STATE_FILE + ".tmp.*"):  # left by a process killed mid-save
            stale.unlink(missing_ok=True)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def load(self) -> ConsumerState | None:
        self.acquire()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return ConsumerState.from_json(raw, source=str(self.path))

    def save(self, state: ConsumerState) -> None:
        self.acquire()
        atomic_write(self.path, state.to_json(), tmp=self.directory / f"{STATE_FILE}.tmp.{os.getpid()}")
        self.saves += 1

    def __repr__(self) -> str:
        return f"FileStateStore({str(self.directory)!r})"
