"""The control messages of the stream protocol, defined once for server, clients and the AsyncAPI doc.

Theory of operation
-------------------
Every control message is a JSON object ``{"type": ..., <fields>}`` in a WebSocket text frame.
Each message type is a frozen, slotted dataclass registered with ``@message(type, sender,
**fields)``, where every field names a ``Kind`` (``engine.protocol.fields``): the one description
of that field that decodes, encodes and documents it.  A field whose dataclass attribute has a
default may be omitted on the wire.

Both directions use the type name ``barrier`` (client: "here is a cookie"; server: "your cookie
is done"), so each direction has its own registry (``CLIENT_MESSAGES``, ``SERVER_MESSAGES``) and
decoding needs to know who sent the text (``engine.protocol.encoding``).

Server messages that a client surfaces as an event of the same concept carry a ``Message``
suffix (``StreamEndMessage``, ``BarrierReachedMessage``), so the wire message and the public event
(``clients.StreamEnd``, ``clients.BarrierReached``) never share a name.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from dataclasses import fields as dc_fields
from typing import Any, TypeVar

from engine.core.rollback import RollbackReason
from engine.core.types import MAX_SEQNO, FailoverEntry, PartitionState
from engine.protocol.fields import (
    PARTITION,
    U64,
    Bool,
    Enum,
    FailoverLogKind,
    Int,
    Kind,
    Nullable,
    PartitionList,
    PartitionMap,
    Record,
    Str,
)
from engine.protocol.limits import MAX_COOKIE_CHARS, MAX_NAME_CHARS, MAX_PARTITION_ID, MAX_TEXT_CHARS, MAX_WINDOW_BYTES

__all__ = [
    "CLIENT_MESSAGES",
    "SERVER_MESSAGES",
    "PROTOCOL_VERSION",
    "Ack",
    "Barrier",
    "BarrierReachedMessage",
    "ClientMessage",
    "CloseStream",
    "Codec",
    "CycleComplete",
    "Error",
    "FailoverLogs",
    "Frames",
    "Hello",
    "PartitionInfo",
    "SeqnoAck",
    "Sender",
    "ServerMessage",
    "SnapshotMarker",
    "SnapshotSource",
    "StreamEndMessage",
    "StreamEndReason",
    "StreamRequest",
    "StreamResponse",
    "StreamStatus",
    "Visibility",
    "message",
]

PROTOCOL_VERSION = 1


# Enums whose value is their wire text are StrEnums: a member formats as that text, so a detail
# string or log line built from a decoded message reads as the wire does.


class Sender(enum.StrEnum):
    CLIENT = "client"
    SERVER = "server"


class Codec(enum.StrEnum):
    """How item batches travel: ``binary`` frames (columnar, see frames.py) or JSON ``items``."""

    JSON = "json"
    BINARY = "binary"


class StreamStatus(enum.StrEnum):
    OK = "ok"
    ROLLBACK = "rollback"
    NOT_MY_PARTITION = "not_my_partition"
    RANGE_ERROR = "range_error"


class SnapshotSource(enum.StrEnum):
    DISK = "disk"
    MEMORY = "memory"


class Visibility(enum.StrEnum):
    """Which writes a consumer may receive (hello ``visibility``).

    ``memory``: every write as soon as it is queued (an unclean restart or a failover may take
    some back: the consumer is then told to roll back).  ``persisted``: only writes at or below
    the partition's persisted seqno, which an unclean restart cannot lose.  ``majority``: only
    writes a majority of the partition's copies hold, which a failover cannot lose (on a node
    without a cluster there is no failover, so it is ``memory``)."""

    MEMORY = "memory"
    PERSISTED = "persisted"
    MAJORITY = "majority"


class Frames(enum.StrEnum):
    """How a pass's snapshot markers and item batches travel (hello ``frames``): ``messages``,
    one message each (default), or ``packed``: a pass's markers and batches in one packed pass
    (``engine.protocol.packed``; needs ``codec: "binary"`` and ``bundle: true``)."""

    MESSAGES = "messages"
    PACKED = "packed"


class StreamEndReason(enum.StrEnum):
    END_SEQNO_REACHED = "end_seqno_reached"
    STATE_CHANGED = "state_changed"
    SHUTTING_DOWN = "shutting_down"
    TOO_SLOW = "too_slow"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """What a client learns about one partition in ``failover_logs`` (and the session is told)."""

    state: PartitionState
    high_seqno: int
    purge_seqno: int
    log: tuple[FailoverEntry, ...]


PARTITION_INFO = Record(
    PartitionInfo,
    {
        "state": Enum(PartitionState, "partition state"),
        "high_seqno": Int(0, MAX_SEQNO, "highest seqno assigned"),
        "purge_seqno": Int(0, MAX_SEQNO, "tombstones at or below this seqno may be purged"),
        "log": FailoverLogKind("failover log, newest first: [[uuid, seqno], ...]"),
    },
)


# ----------------------------------------------------------------------------- message registry

ClientMessage = Any  # one of CLIENT_MESSAGES.values(); Any keeps the registry simple to type
ServerMessage = Any
CLIENT_MESSAGES: dict[str, type] = {}
SERVER_MESSAGES: dict[str, type] = {}
_T = TypeVar("_T")


def message(type_name: str, sender: Sender, **kinds: Kind) -> Callable[[type[_T]], type[_T]]:
    """Register a dataclass as the message ``type_name`` sent by ``sender``; ``kinds`` per field."""

    def register(cls: type[_T]) -> type[_T]:
        names = [f.name for f in dc_fields(cls)]  # type: ignore[arg-type]
        assert names == list(kinds), f"{cls.__name__}: kinds {list(kinds)} != fields {names}"
        cls.TYPE = type_name  # type: ignore[attr-defined]
        cls.SENDER = sender  # type: ignore[attr-defined]
        cls.FIELDS = kinds  # type: ignore[attr-defined]
        cls.OPTIONAL = frozenset(  # type: ignore[attr-defined]
            f.name for f in dc_fields(cls) if f.default is not MISSING  # type: ignore[arg-type]
        )
        registry = CLIENT_MESSAGES if sender is Sender.CLIENT else SERVER_MESSAGES
        assert type_name not in registry
        registry[type_name] = cls
        return cls

    return register


# ----------------------------------------------------------------------------- client -> server


@message(
    "hello",
    Sender.CLIENT,
    name=Str(1, MAX_NAME_CHARS, "consumer name, for logs and GET /streams (DCP: at most 200)"),
    partitions=Nullable(PartitionList("partitions to stream; null means all")),
    codec=Enum(Codec, "item batch codec: binary frames or JSON items messages"),
    window_bytes=Nullable(Int(0, MAX_WINDOW_BYTES), "flow-control window in bytes; null: server default"),
    protocol=Int(1, 1 << 16, "protocol version; this server speaks 1"),
    bundle=Bool("the client accepts bundle frames (several messages in one binary message, "
                "engine.protocol.bundle); false: one WebSocket message per message"),
    visibility=Enum(Visibility, "which writes this connection's streams deliver: memory (all, default), "
                    "persisted (never above the partition's persisted seqno: no rollback after an "
                    "unclean restart), majority (never above what a majority of the partition's "
                    "copies hold: no rollback after a failover)"),
    frames=Enum(Frames, "how a pass's markers and batches travel: messages (one each, default) or "
                "packed (a pass's markers and batches in one packed pass part, engine.protocol.packed; "
                "needs codec binary and bundle true)"),
)
@dataclass(frozen=True, slots=True)
class Hello:
    """First message on a connection, exactly once: who the consumer is and what it wants."""

    name: str
    partitions: tuple[int, ...] | None = None
    codec: Codec = Codec.JSON
    window_bytes: int | None = None
    protocol: int = PROTOCOL_VERSION
    bundle: bool = False
    visibility: Visibility = Visibility.MEMORY
    frames: Frames = Frames.MESSAGES


@message(
    "stream_request",
    Sender.CLIENT,
    partition=PARTITION,
    uuid=Int(0, MAX_SEQNO, "uuid of the failover entry the consumer last saw (0: none)"),
    start_seqno=Int(0, MAX_SEQNO, "last seqno the consumer has (stream starts after it)"),
    snap_start=Int(0, MAX_SEQNO, "start of the last snapshot the consumer received"),
    snap_end=Int(0, MAX_SEQNO, "end of the last snapshot the consumer received"),
    expected_state=Enum(
        (PartitionState.ACTIVE, PartitionState.REPLICA), "state the consumer expects the partition to be in"
    ),
    end_seqno=Nullable(Int(0, MAX_SEQNO), "end the stream after the snapshot containing it; null: endless"),
    to_now=Bool("end at the partition's high seqno at request time (overrides end_seqno)"),
    strict_uuid=Bool("check the uuid even at start_seqno 0 (DCP StrictVBUUID)"),
)
@dataclass(frozen=True, slots=True)
class StreamRequest:
    """Open (or resume) one partition's stream from a saved position."""

    partition: int
    uuid: int
    start_seqno: int
    snap_start: int
    snap_end: int
    expected_state: PartitionState = PartitionState.ACTIVE
    end_seqno: int | None = None
    to_now: bool = False
    strict_uuid: bool = False


@message("close_stream", Sender.CLIENT, partition=PARTITION)
@dataclass(frozen=True, slots=True)
class CloseStream:
    """Stop one partition's stream; answered by ``stream_end`` with reason ``closed``."""

    partition: int


@message("barrier", Sender.CLIENT, cookie=Str(1, MAX_COOKIE_CHARS, "unique among pending cookies on this connection"))
@dataclass(frozen=True, slots=True)
class Barrier:
    """Ask for a consistent cut: the cookie comes back once every stream was visited after it."""

    cookie: str


@message("ack", Sender.CLIENT, bytes=Int(0, MAX_WINDOW_BYTES, "frame bytes processed since the last ack"))
@dataclass(frozen=True, slots=True)
class Ack:
    """Flow control: free ``bytes`` of the window (UTF-8 length of text frames, size of binary frames)."""

    bytes: int


@message(
    "seqno_ack",
    Sender.CLIENT,
    partition=PARTITION,
    received=Int(0, MAX_SEQNO, "highest seqno of the partition the replica holds in memory"),
    persisted=Int(0, MAX_SEQNO, "highest seqno of the partition the replica has persisted (<= received)"),
)
@dataclass(frozen=True, slots=True)
class SeqnoAck:
    """A replica tells its active what it holds (DCP_SEQNO_ACKNOWLEDGED); replication connections only."""

    partition: int
    received: int
    persisted: int


# ----------------------------------------------------------------------------- server -> client


@message(
    "failover_logs",
    Sender.SERVER,
    node_id=Str(1, MAX_NAME_CHARS, "stable id of the server's data dir"),
    partition_count=Int(1, MAX_PARTITION_ID + 1, "number of partitions of the keyspace"),
    partitions=PartitionMap(PARTITION_INFO, "per requested partition: state, seqnos, failover log"),
)
@dataclass(frozen=True, slots=True)
class FailoverLogs:
    """Answer to hello: the failover log and seqnos of every requested partition."""

    node_id: str
    partition_count: int
    partitions: Mapping[int, PartitionInfo]


@message(
    "stream_response",
    Sender.SERVER,
    partition=PARTITION,
    status=Enum(StreamStatus),
    rollback_seqno=Nullable(Int(0, MAX_SEQNO), "status rollback: discard everything above this seqno"),
    reason=Nullable(Enum(RollbackReason), "status rollback: the rule that decided it"),
    detail=Str(0, MAX_TEXT_CHARS, "human explanation naming the rule and the numbers"),
    failover_log=Nullable(FailoverLogKind(), "status ok/rollback: the partition's failover log, newest first"),
    field=Nullable(Str(1, 64), "status range_error: the offending request field"),
    end_seqno=Nullable(Int(0, MAX_SEQNO), "status ok: the stream's end seqno (to_now resolved); null: endless"),
)
@dataclass(frozen=True, slots=True)
class StreamResponse:
    """Per-partition answer to ``stream_request``."""

    partition: int
    status: StreamStatus
    rollback_seqno: int | None = None
    reason: RollbackReason | None = None
    detail: str = ""
    failover_log: tuple[FailoverEntry, ...] | None = None
    field: str | None = None
    end_seqno: int | None = None


@message(
    "snapshot",
    Sender.SERVER,
    partition=PARTITION,
    start=Int(0, MAX_SEQNO, "first seqno the snapshot may contain"),
    end=Int(0, MAX_SEQNO, "last seqno the snapshot covers; after its last batch the position is end"),
    source=Enum(SnapshotSource),
    purge_seqno=Int(0, MAX_SEQNO, "the partition's purge seqno when the snapshot was taken"),
)
@dataclass(frozen=True, slots=True)
class SnapshotMarker:
    """Items of one consistent snapshot follow (each key at most once, seqno order)."""

    partition: int
    start: int
    end: int
    source: SnapshotSource
    purge_seqno: int = 0


@message("cycle_complete", Sender.SERVER, cycle=Int(0, MAX_SEQNO, "number of passes completed"))
@dataclass(frozen=True, slots=True)
class CycleComplete:
    """The server finished a pass over the streams that had anything to check, in id order."""

    cycle: int


@message(
    "barrier",
    Sender.SERVER,
    cookie=Str(1, MAX_COOKIE_CHARS),
    seqnos=PartitionMap(U64, "per streamed partition: its position (last seqno sent) at release"),
)
@dataclass(frozen=True, slots=True)
class BarrierReachedMessage:
    """Your cookie: everything written before you sent it has been delivered."""

    cookie: str
    seqnos: Mapping[int, int]


@message(
    "stream_end",
    Sender.SERVER,
    partition=PARTITION,
    reason=Enum(StreamEndReason),
    last_seqno=Int(0, MAX_SEQNO, "the stream's position when it ended"),
)
@dataclass(frozen=True, slots=True)
class StreamEndMessage:
    """No more items for this partition on this connection."""

    partition: int
    reason: StreamEndReason
    last_seqno: int


@message(
    "error",
    Sender.SERVER,
    code=Str(1, 64, "stable error code (engine.protocol.errors.ErrorCode)"),
    message=Str(0, MAX_TEXT_CHARS),
    field=Nullable(Str(1, 200), "the offending field, dotted for nested ones"),
    partition=Nullable(PARTITION),
)
@dataclass(frozen=True, slots=True)
class Error:
    """Something the client sent was refused; a close frame follows if the connection must end."""

    code: str
    message: str
    field: str | None = None
    partition: int | None = None
