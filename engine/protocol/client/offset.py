"""``StreamOffset``: where a consumer stands in one partition's history (java-dcp-client's noun).

A position is never a bare seqno: the uuid names the history branch the seqno belongs to, and the
snapshot range says whether the consumer holds a whole snapshot (``seqno == snap_end``) or only part
of one.  The server needs all four to decide whether the consumer may resume or must roll back
(a partial snapshot of deduplicated items is not a state that ever existed, see dcp.md §1).
Offsets serialise to JSON primitives so Spark and backup tools can store them anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.errors import InvalidInput

__all__ = ["StreamOffset"]


@dataclass(frozen=True, slots=True)
class StreamOffset:
    """Resume point of one partition: ``snap_start <= seqno <= snap_end`` always holds."""

    uuid: int = 0
    seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0

    def __post_init__(self) -> None:
        for name in ("uuid", "seqno", "snap_start", "snap_end"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInput(f"StreamOffset.{name} must be a non-negative int, got {value!r}", field=name)
        if not self.snap_start <= self.seqno <= self.snap_end:
            # DCP answers ERANGE to such a request (java-dcp-client#41, JDCP-95): refuse it here.
            raise InvalidInput(
                f"StreamOffset needs snap_start <= seqno <= snap_end, got "
                f"{self.snap_start} <= {self.seqno} <= {self.snap_end}",
                field="seqno",
            )

    @classmethod
    def beginning(cls) -> "StreamOffset":
        return cls(0, 0, 0, 0)

    @classmethod
    def at(cls, uuid: int, seqno: int) -> "StreamOffset":
        """A position at a snapshot boundary (the consumer holds everything up to ``seqno``)."""
        return cls(uuid, seqno, seqno, seqno)

    @property
    def complete(self) -> bool:
        """True when the consumer holds the whole snapshot it is in."""
        return self.seqno == self.snap_end

    def to_dict(self) -> dict[str, int]:
        return {"uuid": self.uuid, "seqno": self.seqno, "snap_start": self.snap_start, "snap_end": self.snap_end}

    @classmethod
    def from_dict(cls, data: Any) -> "StreamOffset":
        if not isinstance(data, dict):
            raise InvalidInput(f"StreamOffset must be an object, got {type(data).__name__}", field="offset")
        try:
            return cls(int(data["uuid"]), int(data["seqno"]), int(data["snap_start"]), int(data["snap_end"]))
        except KeyError as exc:
            raise InvalidInput(f"StreamOffset is missing {exc.args[0]!r}", field=str(exc.args[0])) from None
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"StreamOffset has a non-integer field: {exc}", field="offset") from None
