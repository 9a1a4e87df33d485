"""The rollback ring's log file: ``RollbackRing`` is the pure ``RingModel`` (what the ring holds and
covers, ``engine.protocol.client.ring``) made durable in one directory (no LMDB: clients must not
import it).

    file   := b"UPRRING1" chunk*
    chunk  := u32 payload_len, u32 crc32(payload), payload      (payload: the model's records)

Every update goes to the model, which queues its records; ``flush`` writes them, in order, one
chunk per update with a single ``os.write``.  ``RollbackRing``'s own update methods flush at once,
so a batch is in the file *before* it is handed to the handler and a consumer killed at any point
finds every key it may have applied (the page cache survives a SIGKILL).  The client protocol
session updates ``ring.model`` directly (no I/O); its records reach the file at the next flush,
at the latest in ``sync()``, which the consumer calls before it saves its state, so a saved state
never claims items the ring lost to a power cut.  A torn last chunk (crc mismatch or short) is cut
off on open.  The log is compacted (rewritten as floors + live entries, write-temp + fsync +
rename + fsync dir) whenever it grew by ``capacity // 2`` records, so the file holds at most about
1.5 × capacity records.
"""
from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

from engine.protocol.client.ring import RingEntry, RingModel

from .errors import StateCorrupt
from .files import atomic_write

__all__ = ["RingEntry", "RingModel", "RollbackRing"]

MAGIC = b"UPRRING1"
_CHUNK = struct.Struct("<II")
FILE_NAME = "ring.log"


class RollbackRing:
    """A ``RingModel`` of ``capacity`` entries, with its durable log in ``directory`` (optional)."""

    def __init__(self, capacity: int = 100_000, directory: str | os.PathLike[str] | None = None) -> None:
        self.model = RingModel(capacity, journal=directory is not None)
        self.capacity = capacity
        self._path = Path(directory) / FILE_NAME if directory is not None else None
        self._fd: int | None = None
        self._records_since_compaction = 0
        self._compact_every = max(capacity // 2, 64)
        self._dirty = False
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._load()

    # ------------------------------------------------------------------ queries (the model's)
    def __len__(self) -> int:
        return len(self.model)

    @property
    def path(self) -> Path | None:
        return self._path

    def floor(self, partition: int) -> int | None:
        return self.model.floor(partition)

    def covers(self, partition: int, seqno: int) -> bool:
        return self.model.covers(partition, seqno)

    def oldest_seqno(self, partition: int) -> int | None:
        return self.model.oldest_seqno(partition)

    def entries(self, partition: int | None = None) -> list[RingEntry]:
        return self.model.entries(partition)

    def entries_above(self, partition: int, seqno: int) -> list[RingEntry]:
        return self.model.entries_above(partition, seqno)

    def keys_above(self, partition: int, seqno: int) -> list[bytes]:
        return self.model.keys_above(partition, seqno)

    def keys_above_many(self, positions: dict[int, int]) -> dict[int, list[bytes]]:
        return self.model.keys_above_many(positions)

    # ------------------------------------------------------------------ updates, written at once
    def set_floor(self, partition: int, seqno: int) -> None:
        self.model.set_floor(partition, seqno)
        self.flush()

    def append(self, partition: int, seqno: int, key: bytes) -> None:
        self.append_batch(partition, (seqno,), (key,))

    def append_batch(self, partition: int, seqnos: Sequence[int], keys: Sequence[bytes]) -> None:
        """Record a batch of items about to be applied; in the file when this returns."""
        self.model.append_batch(partition, seqnos, keys)
        self.flush()

    def drop_above(self, partition: int, seqno: int) -> int:
        dropped = self.model.drop_above(partition, seqno)
        self.flush()
        return dropped

    def replace_above(self, partition: int, seqno: int, entries: Sequence[tuple[bytes, int]] = ()) -> None:
        self.model.replace_above(partition, seqno, entries)
        self.flush()

    def reset(self, partition: int) -> None:
        self.model.reset(partition)
        self.flush()

    # ------------------------------------------------------------------ the file
    def flush(self) -> None:
        """Write the model's queued records, one chunk per update, then compact if it is time."""
        if self._fd is None:
            return
        for payload, records in self.model.take_journal():
            os.write(self._fd, _CHUNK.pack(len(payload), zlib.crc32(payload)) + payload)
            self._dirty = True
            self._records_since_compaction += records
        if self._records_since_compaction >= self._compact_every:
            self.compact()

    def sync(self) -> None:
        """Flush and fsync the log: call before saving consumer state that relies on these entries."""
        self.flush()
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
            self._dirty = False

    def close(self) -> None:
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RollbackRing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def compact(self) -> None:
        """Rewrite the log as floors + live entries, atomically (nothing may be queued: see flush)."""
        if self._path is None:
            return
        payload = self.model.snapshot_payload()
        atomic_write(self._path, MAGIC + _CHUNK.pack(len(payload), zlib.crc32(payload)) + payload,
                     tmp=self._path.with_name(FILE_NAME + ".tmp"))
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._records_since_compaction = 0
        self._dirty = False

    def _load(self) -> None:
        assert self._path is not None
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            data = b""
        if not data:
            atomic_write(self._path, MAGIC, tmp=self._path.with_name(FILE_NAME + ".tmp"))
            good = len(MAGIC)
        else:
            if not data.startswith(MAGIC):
                raise StateCorrupt(f"{self._path} is not a rollback ring log (bad magic)")
            good = self._replay(data)
        self.model.take_journal()  # replayed records are in the file already
        if good < len(data):
            os.truncate(self._path, good)  # torn tail from a crash mid-write: never applied, safe to cut
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        if self._records_since_compaction >= self._compact_every:
            self.compact()

    def _replay(self, data: bytes) -> int:
        pos = len(MAGIC)
        end = len(data)
        unpack_chunk = _CHUNK.unpack_from
        while pos + _CHUNK.size <= end:
            length, crc = unpack_chunk(data, pos)
            body_start = pos + _CHUNK.size
            body_end = body_start + length
            if body_end > end or zlib.crc32(data[body_start:body_end]) != crc:
                break
            self._records_since_compaction += self.model.apply(data, body_start, body_end, where=str(self._path))
            pos = body_end
        return pos
