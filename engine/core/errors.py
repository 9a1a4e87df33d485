"""The engine's error tree.

    UprError                      base; ``code`` is a stable machine-readable string
    ├── InvalidInput              bad request data (422)
    │   ├── InvalidKey            empty, too long, not UTF-8
    │   └── InvalidPartition      partition id out of range
    ├── TooLarge                  key/value/batch over a configured limit (413)
    ├── KeyNotFound               no live document (404)
    ├── CasMismatch               compare-and-swap lost (412)
    ├── PartitionNotActive        write to a replica/pending/dead partition (503)
    ├── NotReplica                replica-only operation on a partition that is not a replica
    ├── Backpressure              write queue over its memory limit (429); retriable
    ├── InsufficientStorage       applied and queued, but the disk is full: not persisted (507)
    ├── DiskFull                  a change that goes straight to disk was refused: nothing changed (507)
    ├── SeqnoRangeError           stream request outside what the partition has (DCP ERANGE)
    └── EngineClosed              the engine is shut down (503)

Every error carries the data needed to say what to fix (``field``, ``partition``,
``seqno``) so the HTTP layer and the stream protocol can render it without parsing
messages.  Pure standard library: clients raise and catch these too.
"""
from __future__ import annotations

from errno import ENOSPC as _ENOSPC


class UprError(Exception):
    """Base of every error upr raises on purpose."""

    code: str = "upr_error"
    retriable: bool = False

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        partition: int | None = None,
        seqno: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.partition = partition
        self.seqno = seqno

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"code": self.code, "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        if self.partition is not None:
            out["partition"] = self.partition
        if self.seqno is not None:
            out["seqno"] = self.seqno
        return out


class InvalidInput(UprError):
    code = "invalid_input"


class InvalidKey(InvalidInput):
    code = "invalid_key"


class InvalidPartition(InvalidInput):
    code = "invalid_partition"


class TooLarge(UprError):
    code = "too_large"


class KeyNotFound(UprError):
    code = "key_not_found"


class CasMismatch(UprError):
    code = "cas_mismatch"

    def __init__(self, message: str, *, expected: int | None = None, actual: int | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.expected = expected
        self.actual = actual


class PartitionNotActive(UprError):
    code = "partition_not_active"
    retriable = True


class NotReplica(UprError):
    """A replica-only operation (apply replicated items, promote) on a partition in another state."""

    code = "partition_not_replica"


class Backpressure(UprError):
    code = "backpressure"
    retriable = True


class InsufficientStorage(UprError):
    """A write was applied and stays queued in memory, but could not be persisted: the disk is full.

    WHY its own error (not EngineClosed or a bare OSError): the outcome differs from every other
    failure.  The write happened (it has its seqno, readers and streams see it) and the flusher
    persists it by itself once space returns; only its durability is missing, and only for now.
    ``unpersisted`` maps each partition the caller waited on to the seqno it waited for.
    """

    code = "insufficient_storage"

    def __init__(self, message: str, *, unpersisted: dict[int, int] | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.unpersisted = dict(unpersisted or {})


class DiskFull(UprError):
    """A change that is written straight to disk (a state change, a compaction, a promotion)
    could not be committed because the disk or quota is full: nothing changed.

    WHY apart from ``InsufficientStorage``: there the write happened and waits in memory; here
    the transaction was aborted, so the caller may simply retry once space returns.
    ``errno`` is the operating system's reason (ENOSPC, EDQUOT or EIO for a write cut short).
    """

    code = "disk_full"
    retriable = True

    def __init__(self, message: str, *, errno: int = _ENOSPC, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.errno = errno


class SeqnoRangeError(UprError):
    code = "seqno_range"


class EngineClosed(UprError):
    code = "engine_closed"
    retriable = True
