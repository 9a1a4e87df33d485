"""Deciding the next end offset in the driver: rollback checks, ``onRollback`` policies, budgets.

``latestOffset`` runs this once per trigger against fresh server metadata (high seqnos, purge
seqnos, failover logs).  A history branch is never followed silently: every partition whose start
position is no longer on the server's history is handled by the policy before any data is planned.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from engine.core.errors import UprError

from .cuts import end_position
from .offsets import PartitionOffset, SourceOffset
from .options import OnRollback, Position, Start
from .planning import apply_budget


@dataclass(frozen=True, slots=True)
class ServerPartition:
    """What the driver knows of one server partition at planning time."""

    partition: int
    high_seqno: int
    purge_seqno: int
    failover_log: tuple[tuple[int, int], ...]   # (uuid, seqno), newest first
    state: str = "active"
    persisted_seqno: int = 0

    @property
    def uuid(self) -> int:
        return self.failover_log[0][0] if self.failover_log else 0


@dataclass(frozen=True, slots=True)
class ServerMeta:
    """``partitions``: those whose metadata was read; ``unavailable``: partitions of the server
    (a cluster) that have no live active node now, with the reason.  Planning leaves those where
    they are and the next trigger tries again, as a consumer does (``Unserved``)."""

    num_partitions: int
    partitions: Mapping[int, ServerPartition]
    unavailable: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RollbackNeeded:
    """The server's answer for a start position: roll back to ``seqno`` because of ``reason``."""

    seqno: int
    reason: str


#: (partition position, server partition) -> None when the position is on the server's history.
RollbackCheck = Callable[[PartitionOffset, ServerPartition], "RollbackNeeded | None"]


class RollbackRequired(UprError):
    """``onRollback=fail`` met a history branch; the query stops with partition and seqno."""

    code = "rollback_required"

    def __init__(self, partition: int, seqno: int, reason: str) -> None:
        super().__init__(
            f"ROLLBACK_REQUIRED partition {partition} to seqno {seqno} ({reason}); "
            "onRollback=fail stops here: restart with a new checkpoint, or use "
            "onRollback=resetPartition or refetch", partition=partition, seqno=seqno)
        self.reason = reason


class PartitionCountChanged(UprError):
    code = "partition_count_changed"


def select_partitions(meta: ServerMeta, wanted: tuple[int, ...] | None) -> list[int]:
    from .options import OptionError
    if wanted is None:
        return sorted({*meta.partitions, *meta.unavailable})
    missing = [p for p in wanted if p not in meta.partitions and p not in meta.unavailable]
    if missing:
        raise OptionError("partitions", f"server has partitions 0-{meta.num_partitions - 1}; "
                                        f"not there: {missing[:10]}")
    return list(wanted)


def format_ids(ids: list[int] | tuple[int, ...]) -> str:
    """Partition ids as ranges, e.g. ``0-3,7``."""
    out: list[str] = []
    for p in sorted(set(ids)):
        if out and out[-1].split("-")[-1] == str(p - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{p}"
        else:
            out.append(str(p))
    return ",".join(out)


def check_same_partitions(start: SourceOffset, selected: list[int]) -> None:
    """A restarted query streams the partitions its checkpoint holds: a ``partitions`` option that
    now names others is refused, naming both, rather than silently ignored."""
    held = sorted(start.partitions)
    if held != sorted(selected):
        from .options import OptionError
        raise OptionError("partitions", f"the checkpoint streams partitions {format_ids(held)} but the option "
                                        f"now selects {format_ids(selected)}; set it back or start a new checkpoint")


def lag_metrics(planned: SourceOffset | None, latest: SourceOffset) -> dict[str, str]:
    """Kafka's ``minOffsetsBehindLatest``/``avgOffsetsBehindLatest``/``maxOffsetsBehindLatest``:
    seqnos between the planned end and the latest offset, over the partitions; {} before a plan."""
    if planned is None or planned.latest_sentinel:
        return {}
    behind = [max(0, o.seqno - planned.partitions[p].seqno) for p, o in latest.partitions.items()
              if p in planned.partitions]
    if not behind:
        return {}
    return {"minOffsetsBehindLatest": str(min(behind)), "avgOffsetsBehindLatest": f"{sum(behind) / len(behind):.1f}",
            "maxOffsetsBehindLatest": str(max(behind))}


def initial_offset(spec: Position | Mapping[int, Start], meta: ServerMeta, selected: list[int]) -> SourceOffset:
    """The start of a new query.  Deterministic, because Spark calls it more than once: anything
    that says "latest" yields the sentinel and is resolved by ``resolve_sentinel`` in latestOffset."""
    if spec is Position.LATEST or (isinstance(spec, Mapping) and Position.LATEST in spec.values()):
        return SourceOffset.latest()
    out = {}
    for pid in selected:
        given = spec.get(pid, Position.EARLIEST) if isinstance(spec, Mapping) else Position.EARLIEST
        out[pid] = given if isinstance(given, PartitionOffset) else PartitionOffset()
    return SourceOffset(out, meta.num_partitions)


def resolve_positions(spec: Position | Mapping[int, Start], meta: ServerMeta, selected: list[int],
                      unlisted: Position = Position.EARLIEST) -> SourceOffset:
    """Every position made concrete against the server's current state (latest = high seqno now);
    partitions a JSON spec does not name get ``unlisted``."""
    out = {}
    for pid in selected:
        given = spec.get(pid, unlisted) if isinstance(spec, Mapping) else spec
        if isinstance(given, PartitionOffset):
            out[pid] = given
        elif given is Position.LATEST:
            if pid in meta.unavailable:
                from .cluster_map import NoActiveNode
                raise NoActiveNode(meta.unavailable[pid])
            sp = meta.partitions[pid]
            out[pid] = PartitionOffset(sp.uuid, sp.high_seqno, sp.high_seqno, sp.high_seqno)
        else:
            out[pid] = PartitionOffset()
    return SourceOffset(out, meta.num_partitions)


def next_offset(
    start: SourceOffset,
    meta: ServerMeta,
    *,
    check: RollbackCheck,
    policy: OnRollback,
    max_rows: int | None = None,
    target: Mapping[int, int] | None = None,
) -> SourceOffset:
    """The end offset of the next batch from ``start``.

    Per partition: check the start position against the server's history; on a branch apply the
    policy (``fail`` raises, ``resetPartition`` bumps the generation and restreams from 0,
    ``refetch`` bumps it and streams on from the rollback seqno R); then advance towards the high
    seqno, clamped to ``target`` (Trigger.AvailableNow) and to the ``max_rows`` budget.  Returns
    ``start`` itself when there is nothing to do, which is how Spark learns a batch is not needed.
    """
    if start.num_partitions and meta.num_partitions != start.num_partitions:
        raise PartitionCountChanged(
            f"server now has {meta.num_partitions} partitions, the checkpoint {start.num_partitions}; "
            "restart with a new checkpoint")
    restart: dict[int, PartitionOffset] = {}   # partition -> position the stream resumes from
    held: dict[int, PartitionOffset] = {}      # partitions without a live active: where they are
    for pid, pos in start.partitions.items():
        sp = meta.partitions.get(pid)
        if sp is None and pid in meta.unavailable:
            held[pid] = pos
            continue
        if sp is None:
            raise PartitionCountChanged(f"partition {pid} no longer exists on the server")
        verdict = check(pos, sp)
        if verdict is None:
            restart[pid] = pos
            continue
        if policy is OnRollback.FAIL:
            raise RollbackRequired(pid, verdict.seqno, verdict.reason)
        r = 0 if policy is OnRollback.RESET_PARTITION else min(verdict.seqno, pos.seqno)
        restart[pid] = PartitionOffset(sp.uuid, r, r, r, pos.generation + 1, restart_from=r)
    backlogs = {}
    for pid, pos in restart.items():
        ceiling = meta.partitions[pid].high_seqno
        if target is not None and pid in target:
            ceiling = min(ceiling, target[pid])
        backlogs[pid] = max(0, ceiling - pos.seqno)
    allowed = apply_budget(backlogs, max_rows)
    out = {}
    for pid, pos in restart.items():
        sp = meta.partitions[pid]
        old = start.partitions[pid]
        step = allowed.get(pid, 0)
        if step == 0 and pos.generation == old.generation:
            out[pid] = old          # unchanged: keeps start == end when nothing is new
            continue
        # an exact range: the batch delivers up to s and no further, so s may sit inside a
        # snapshot the server draws only when the batch is read (spark_connector.cuts)
        out[pid] = end_position(replace(pos, uuid=sp.uuid), pos.seqno + step, sp.uuid, sp.persisted_seqno)
    out.update(held)
    return SourceOffset(dict(sorted(out.items())), meta.num_partitions)
