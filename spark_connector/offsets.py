"""Source offsets: per-partition stream positions as JSON-primitive dicts.

Spark stores the offset a source returns verbatim in ``<checkpoint>/offsets/<batch>`` and only ever
compares offsets for equality, so the shape is ours.  It must carry everything a resumed stream
request needs (DCP never resumes from a bare seqno): the branch ``uuid``, the last ``seqno``
delivered and the snapshot range containing it, plus a rollback generation ``g`` that is bumped on
every reset or rollback, so an offset after a rollback never equals one before it.

Layout (``v`` = format version, ``np`` = server partition count)::

    {"v": 1, "np": 64, "p": {"0": {"u": "1234", "s": 1500, "ss": 1400, "se": 1500, "g": 0}, ...}}

``r`` (only in an end offset whose ``g`` differs from the start's) is the seqno the partition is
restreamed from after a rollback: 0 for a reset (control row ``reset``), R > 0 for ``refetch``
(control row ``rollback`` at R).  It lives in the offset because ``partitions(start, end)`` must
plan a replayed batch from the two offsets alone.

``o`` (true, only when set) marks a partial snapshot whose end is unknown: the batch that ended
at ``s`` was cut there, inside a snapshot that may go on past it (``spark_connector.cuts``).

``u`` is a decimal string: uuids are 64-bit and JSON readers in other languages lose precision
above 2**53.  ``{"v": 1, "latest": true}`` is the initial sentinel for ``startingOffsets=latest``:
Spark calls ``initialOffset()`` several times per fresh start, so "now" must be resolved later,
in ``latestOffset``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.errors import InvalidInput
from engine.protocol.client.offset import StreamOffset

FORMAT_VERSION = 1


class OffsetFormatError(ValueError):
    """An offset dict or JSON that does not follow the layout above."""


@dataclass(frozen=True, slots=True)
class PartitionOffset(StreamOffset):
    """Where the consumer of one partition stands: the last item delivered and its snapshot (the
    client's one position type, ``StreamOffset``), plus the source's rollback bookkeeping."""

    generation: int = 0
    restart_from: int | None = None
    open_snapshot: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.generation, int) or self.generation < 0:
            raise OffsetFormatError(f"generation must be a non-negative int, got {self.generation!r}")
        try:
            StreamOffset.__post_init__(self)
        except InvalidInput as exc:
            raise OffsetFormatError(exc.message) from None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"u": str(self.uuid), "s": self.seqno, "ss": self.snap_start,
                               "se": self.snap_end, "g": self.generation}
        if self.restart_from is not None:
            out["r"] = self.restart_from
        if self.open_snapshot:
            out["o"] = True
        return out

    @classmethod
    def from_json(cls, raw: Any, *, where: str = "offset") -> PartitionOffset:
        if not isinstance(raw, Mapping):
            raise OffsetFormatError(f"{where}: expected an object, got {type(raw).__name__}")
        uuid = _int(raw.get("u", raw.get("uuid", 0)), f"{where}.uuid")
        seqno = _int(raw.get("s", raw.get("seqno", 0)), f"{where}.seqno")
        # a missing snapshot range is a position at a snapshot end: the range is the seqno
        ss = _int(raw.get("ss", raw.get("snapStart", raw.get("snap_start"))), f"{where}.snapStart", default=seqno)
        se = _int(raw.get("se", raw.get("snapEnd", raw.get("snap_end"))), f"{where}.snapEnd", default=seqno)
        generation = _int(raw.get("g", raw.get("generation", 0)), f"{where}.generation")
        restart_from = _int(raw.get("r"), f"{where}.restartFrom", default=None)
        open_snapshot = raw.get("o", raw.get("openSnapshot", False))
        if not isinstance(open_snapshot, bool):
            raise OffsetFormatError(f"{where}.openSnapshot: expected true or false, got {open_snapshot!r}")
        if min(uuid, seqno, ss, se, generation) < 0:
            raise OffsetFormatError(f"{where}: negative number")
        if not ss <= seqno <= se:
            raise OffsetFormatError(
                f"{where}: snapshot range must satisfy snapStart <= seqno <= snapEnd, "
                f"got {ss} <= {seqno} <= {se}")
        return cls(uuid, seqno, ss, se, generation, restart_from, open_snapshot)


def _int(value: Any, where: str, *, default: int | None = 0) -> Any:
    if value is None:
        return default
    if isinstance(value, bool):
        raise OffsetFormatError(f"{where}: expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise OffsetFormatError(f"{where}: expected an integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class SourceOffset:
    """The position of the whole source: one ``PartitionOffset`` per streamed partition."""

    partitions: Mapping[int, PartitionOffset]
    num_partitions: int
    latest_sentinel: bool = False

    @classmethod
    def latest(cls) -> SourceOffset:
        return cls({}, 0, latest_sentinel=True)

    def to_json(self) -> dict[str, Any]:
        if self.latest_sentinel:
            return {"v": FORMAT_VERSION, "latest": True}
        return {"v": FORMAT_VERSION, "np": self.num_partitions,
                "p": {str(p): self.partitions[p].to_json() for p in sorted(self.partitions)}}

    @classmethod
    def from_json(cls, raw: Any) -> SourceOffset:
        if not isinstance(raw, Mapping):
            raise OffsetFormatError(f"source offset: expected an object, got {type(raw).__name__}")
        if raw.get("v") != FORMAT_VERSION:
            raise OffsetFormatError(f"source offset: unsupported format version {raw.get('v')!r}")
        if raw.get("latest"):
            return cls.latest()
        parts = raw.get("p")
        if not isinstance(parts, Mapping):
            raise OffsetFormatError("source offset: 'p' must be an object of partitions")
        out: dict[int, PartitionOffset] = {}
        for key, value in parts.items():
            pid = _int(key, "source offset partition id")
            out[pid] = PartitionOffset.from_json(value, where=f"partition {pid}")
        return cls(out, _int(raw.get("np", 0), "source offset np"))

    def total_seqnos(self) -> int:
        return sum(o.seqno for o in self.partitions.values())


def stream_start(start: SourceOffset, end: SourceOffset, pid: int) -> tuple[PartitionOffset, str | None]:
    """Where the stream of ``pid`` for the batch ``start -> end`` begins, and which control row
    (``"reset"``, ``"rollback"`` or None) the batch carries for it first."""
    e = end.partitions[pid]
    s = start.partitions.get(pid)
    if s is not None and s.generation == e.generation:
        return s, None
    r = e.restart_from or 0
    if s is None and e.restart_from is None:
        return PartitionOffset(), None     # a partition new to this query: stream it from 0
    pos = PartitionOffset(uuid=e.uuid if r else 0, seqno=r, snap_start=r, snap_end=r,
                          generation=e.generation)
    return pos, ("rollback" if r else "reset")


def backlog(start: SourceOffset, end: SourceOffset) -> dict[int, int]:
    """Seqnos to stream per partition for the batch ``start -> end``."""
    return {pid: max(0, e.seqno - stream_start(start, end, pid)[0].seqno)
            for pid, e in end.partitions.items()}
