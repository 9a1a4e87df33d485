"""Consumer state: what a consumer must remember per partition to resume without skipping anything.

Per partition (a ``PartitionCheckpoint``): the failover log last seen, the ``StreamOffset`` of the last
item *processed* (uuid, seqno, and the snapshot range it lies in, possibly partial), and the last
snapshot processed completely.  Saved state only ever describes processed items (dcp.md §3.4).

``StateStore`` is the narrow pluggable interface (etcd raft's ``Storage`` habit): ``load`` and
``save``, with ``MemoryStateStore`` for tests and throwaway consumers and ``FileStateStore`` as the
durable default.  ``FileStateStore`` writes atomically: write a temp file, fsync it, rename it over
the old one, fsync the directory; a crash at any instant leaves either the old or the new file,
never a half-written one.  It also names where the rollback ring lives (same directory), so one
directory holds everything a consumer needs to resume.
"""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from engine.core.types import FailoverEntry

from .errors import StateCorrupt, UsageError
from .files import atomic_write
from .offset import StreamOffset

__all__ = ["PartitionCheckpoint", "ConsumerState", "StateStore", "MemoryStateStore", "FileStateStore"]

STATE_VERSION = 1
STATE_FILE = "state.json"
LOCK_FILE = "lock"


@dataclass(frozen=True, slots=True)
class PartitionCheckpoint:
    offset: StreamOffset
    failover_log: tuple[FailoverEntry, ...] = ()
    last_complete: tuple[int, int] = (0, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "offset": self.offset.to_dict(),
            "failover_log": [[e.uuid, e.seqno] for e in self.failover_log],
            "last_complete": list(self.last_complete),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PartitionCheckpoint":
        log = tuple(FailoverEntry(int(u), int(s)) for u, s in data.get("failover_log", ()))
        start, end = data.get("last_complete", (0, 0))
        return cls(StreamOffset.from_dict(data["offset"]), log, (int(start), int(end)))


@dataclass(frozen=True, slots=True)
class ConsumerState:
    partitions: Mapping[int, PartitionCheckpoint] = field(default_factory=dict)
    node_id: str | None = None
    partition_count: int | None = None

    def offsets(self) -> dict[int, StreamOffset]:
        return {p: c.offset for p, c in self.partitions.items()}

    def to_json(self) -> bytes:
        doc = {
            "version": STATE_VERSION,
            "node_id": self.node_id,
            "partition_count": self.partition_count,
            "partitions": {str(p): c.to_dict() for p, c in sorted(self.partitions.items())},
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, source: str = "state") -> "ConsumerState":
        try:
            doc = json.loads(raw)
            if doc.get("version") != STATE_VERSION:
                raise StateCorrupt(f"{source}: unsupported state version {doc.get('version')!r}")
            parts = {int(p): PartitionCheckpoint.from_dict(c) for p, c in doc["partitions"].items()}
            return cls(parts, doc.get("node_id"), doc.get("partition_count"))
        except StateCorrupt:
            raise
        except Exception as exc:  # any shape error: the file cannot be trusted
            raise StateCorrupt(f"{source}: cannot read consumer state: {exc}") from None


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
