"""The ``upr`` source's options: parsed and validated once, failing fast with the option's name.

Names follow the Spark Kafka source (``startingOffsets``, ``endingOffsets``,
``maxOffsetsPerTrigger``, ``minPartitions``); ``onRollback`` replaces Kafka's ``failOnDataLoss``
because a CDC source has three sane answers to a history branch, not two.

``startingOffsets`` applies only to a query with a new checkpoint: a restarted query always resumes
from its checkpointed offsets (Kafka's rule), whatever this option says.
"""
from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.errors import InvalidInput
from engine.protocol.client.errors import UsageError
from engine.protocol.client.servers import parse_servers

from .offsets import OffsetFormatError, PartitionOffset
from .retry import RetryPolicy


class OptionError(InvalidInput):
    """A bad ``upr`` source option; ``field`` names the option."""

    code = "invalid_option"

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"option '{option}': {problem}", field=option)


class OnRollback(str, enum.Enum):
    FAIL = "fail"                       # stop the query, naming partition and seqno (Kafka failOnDataLoss)
    RESET_PARTITION = "resetPartition"  # control row 'reset', restream the partition from 0 (default)
    REFETCH = "refetch"                 # control row 'rollback' at R, stream on from R (UPR ring buffer)


class Position(str, enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"


#: A per-partition position given by the user: an explicit offset or earliest/latest.
Start = PartitionOffset | Position

KNOWN = {
    "server": "base URL of the upr server, e.g. http://127.0.0.1:8000, or URL,URL,... of cluster nodes (any will do)",
    "token": "bearer token with at least the read role",
    "partitions": "'all' (default), '0-15,32', or a JSON list of partition ids",
    "startingOffsets": "earliest (default), latest, or per-partition JSON; new checkpoints only",
    "endingOffsets": "batch reads: latest (default) or per-partition JSON",
    "maxOffsetsPerTrigger": "rows per micro-batch, split over partitions by backlog",
    "minPartitions": "Spark tasks to aim for; large backlogs are split into seqno ranges",
    "onRollback": "fail, resetPartition (default) or refetch",
    "failOnDataLoss": "Kafka's name: true = onRollback=fail, false = onRollback=resetPartition",
    "batchRows": "rows per Arrow record batch yielded by read() (default 65536)",
    "batchBytes": "bytes per Arrow record batch at most (default 33554432): big documents end a batch before batchRows",
    "timeout": "seconds for HTTP calls and stream inactivity (default 30)",
    "fetchOffset.numRetries": "retries of a trigger's metadata fetch or stream connect (default 3), as Kafka's",
    "fetchOffset.retryIntervalMs": "wait before the first retry, doubling after each (default 1000)",
    "path": "ignored (Spark passes load(path) here)",
}
_LOWER = {k.lower(): k for k in KNOWN}

#: Rows per Arrow batch a task yields: Spark pays per batch it receives from a Python worker (the
#: executor's Arrow-to-row path), so larger batches cost less CPU per row (docs/benchmarks.md,
#: Spark: batch size on the standalone cluster).
BATCH_ROWS = 65536
#: ... and at most this many bytes, whatever the row count: a batch is held (and copied once, to
#: merge the stream's frames) in the Python worker, so documents of 100 kB must not make 6 GB batches.
BATCH_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class SourceOptions:
    server: str
    token: str | None = None
    partitions: tuple[int, ...] | None = None        # None = all of the server's partitions
    starting: Position | Mapping[int, Start] = Position.EARLIEST
    ending: Position | Mapping[int, Start] = Position.LATEST
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    on_rollback: OnRollback = OnRollback.RESET_PARTITION
    batch_rows: int = BATCH_ROWS
    batch_bytes: int = BATCH_BYTES
    timeout: float = 30.0
    retry: RetryPolicy = RetryPolicy()
    raw: Mapping[str, str] = field(default_factory=dict)
    #: every node URL the user named (``server`` is the first): the map is read from any that answers
    servers: tuple[str, ...] = ()

    @property
    def seeds(self) -> tuple[str, ...]:
        return self.servers or (self.server,)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate Spark's (case-insensitive) options; raises ``OptionError`` naming the first bad one."""
    opts: dict[str, str] = {}
    for key, value in options.items():
        canonical = _LOWER.get(str(key).lower())
        if canonical is None:
            raise OptionError(str(key), _unknown(str(key)))
        opts[canonical] = "" if value is None else str(value)
    if not opts.get("server"):
        raise OptionError("server", "required (base URL of the upr server)")
    servers = parse_server_list(opts["server"])
    return SourceOptions(
        server=servers[0],
        servers=servers,
        token=opts.get("token") or None,
        partitions=parse_partitions(opts.get("partitions", "all")),
        starting=parse_positions("startingOffsets", opts.get("startingOffsets", "earliest")),
        ending=parse_positions("endingOffsets", opts.get("endingOffsets", "latest")),
        max_offsets_per_trigger=_positive_int(opts, "maxOffsetsPerTrigger"),
        min_partitions=_positive_int(opts, "minPartitions"),
        on_rollback=_on_rollback(opts),
        batch_rows=_positive_int(opts, "batchRows") or BATCH_ROWS,
        batch_bytes=_positive_int(opts, "batchBytes") or BATCH_BYTES,
        timeout=_positive_float(opts, "timeout") or 30.0,
        retry=RetryPolicy(_count(opts, "fetchOffset.numRetries", 3),
                          _count(opts, "fetchOffset.retryIntervalMs", 1000) / 1000),
        raw=opts,
    )


def parse_server_list(text: str) -> tuple[str, ...]:
    """``"http://a:1, http://b:2/"`` -> ``("http://a:1", "http://b:2")`` by the clients' rule,
    failing as an ``OptionError`` on ``server``."""
    try:
        return parse_servers(text)
    except UsageError as exc:
        raise OptionError("server", str(exc)) from None


def _unknown(name: str) -> str:
    """One line: Spark hands a Python source its option names lower-cased, so the nearest known
    name (as it is spelled) is what tells the user which one was meant."""
    import difflib
    near = difflib.get_close_matches(name.lower(), list(_LOWER), n=1, cutoff=0.6)
    hint = f"did you mean '{_LOWER[near[0]]}'? " if near else ""
    return f"unknown option; {hint}known options: {', '.join(sorted(KNOWN))}"


def _on_rollback(opts: Mapping[str, str]) -> OnRollback:
    """``onRollback``, or Kafka's ``failOnDataLoss`` (true = fail, false = resetPartition);
    both given must agree."""
    policy = _choice(opts, "onRollback", OnRollback, None)
    text = opts.get("failOnDataLoss")
    if text is None or text == "":
        return policy or OnRollback.RESET_PARTITION
    if text.strip().lower() not in ("true", "false"):
        raise OptionError("failOnDataLoss", f"expected true or false, got {text!r}")
    alias = OnRollback.FAIL if text.strip().lower() == "true" else OnRollback.RESET_PARTITION
    if policy is not None and policy is not alias:
        raise OptionError("failOnDataLoss", f"{text} means onRollback={alias.value}, but onRollback is "
                                            f"{policy.value}: give one of the two")
    return alias


def parse_partitions(text: str) -> tuple[int, ...] | None:
    text = text.strip()
    if text in ("", "all", "*"):
        return None
    if text.startswith("["):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OptionError("partitions", f"malformed JSON: {exc}") from None
        if not isinstance(raw, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in raw):
            raise OptionError("partitions", "JSON form must be a list of integers")
        ids = set(raw)
    else:
        ids = set()
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            try:
                a = int(lo)
                b = int(hi) if sep else a
            except ValueError:
                raise OptionError("partitions", f"bad item {part.strip()!r}; expected 'N' or 'N-M'") from None
            if b < a:
                raise OptionError("partitions", f"bad range {part.strip()!r}: end before start")
            ids.update(range(a, b + 1))
    if not ids or min(ids) < 0:
        raise OptionError("partitions", "partition ids must be non-negative and at least one")
    return tuple(sorted(ids))


def parse_positions(option: str, text: str) -> Position | dict[int, Start]:
    """``earliest`` / ``latest`` / JSON ``{"<pid>": {"uuid":..,"seqno":..,"snapStart":..,"snapEnd":..}}``.

    As in Kafka, ``-2`` means earliest and ``-1`` latest, either as the whole partition value or
    as its seqno.
    """
    text = text.strip()
    for pos in Position:
        if text.lower() == pos.value:
            return pos
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(option, f"expected earliest, latest or per-partition JSON; malformed JSON: {exc}") from None
    if isinstance(raw, dict) and "v" in raw:
        # the offset JSON a query reports (lastProgress endOffset / latestOffset, the checkpoint's
        # offsets file): it round-trips as a start, as Kafka's does
        if raw.get("latest") is True:
            return Position.LATEST
        raw = raw.get("p")
    if not isinstance(raw, dict) or not raw:
        raise OptionError(option, "JSON form must be a non-empty object {\"<partition>\": position}")
    out: dict[int, Start] = {}
    for key, value in raw.items():
        try:
            pid = int(key)
        except ValueError:
            raise OptionError(option, f"partition id {key!r} is not an integer") from None
        if pid < 0:
            raise OptionError(option, f"partition id {pid} is negative")
        sentinel = value.get("seqno") if isinstance(value, dict) else value
        if sentinel == -2 or sentinel == "earliest":
            out[pid] = Position.EARLIEST
        elif sentinel == -1 or sentinel == "latest":
            out[pid] = Position.LATEST
        elif isinstance(value, dict):
            try:
                out[pid] = PartitionOffset.from_json(value, where=f"partition {pid}")
            except OffsetFormatError as exc:
                raise OptionError(option, str(exc)) from None
        else:
            raise OptionError(option, f"partition {pid}: expected an object with uuid, seqno, snapStart, "
                                      "snapEnd (a bare seqno cannot be resumed safely), or -2/-1")
    return out


def _positive_int(opts: Mapping[str, str], name: str) -> int | None:
    text = opts.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(name, f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise OptionError(name, f"expected a positive integer, got {value}")
    return value


def _count(opts: Mapping[str, str], name: str, default: int) -> int:
    text = opts.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(name, f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise OptionError(name, f"expected a non-negative integer, got {value}")
    return value


def _positive_float(opts: Mapping[str, str], name: str) -> float | None:
    text = opts.get(name)
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise OptionError(name, f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise OptionError(name, f"expected a positive number, got {text!r}")
    return value


def _choice(opts: Mapping[str, str], name: str, kind: type[enum.Enum], default: enum.Enum | None) -> Any:
    text = opts.get(name)
    if text is None or text == "":
        return default
    for member in kind:
        if member.value.lower() == text.lower():
            return member
    raise OptionError(name, f"expected one of {', '.join(m.value for m in kind)}, got {text!r}")
