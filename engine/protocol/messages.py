"""Control messages of the stream protocol, defined once for server, clients and the AsyncAPI doc.

Theory of operation
-------------------
Every control message is a JSON object ``{"type": ..., <fields>}`` in a WebSocket text frame.
Each message type is a frozen, slotted dataclass registered with ``@message(type, sender,
**fields)``, where every field names a ``Kind``: the one description of that field that

* validates and converts it when decoding (``Kind.load``: wrong type or range -> ``ProtocolError``
  with code ``invalid_field`` and the field's dotted name),
* renders it when encoding (``Kind.dump``),
* and describes it as JSON Schema for ``openapi/asyncapi.yaml`` (``Kind.schema``), which a test
  keeps in sync with this module.

A field whose dataclass attribute has a default may be omitted on the wire.  Unknown fields are
refused (``unknown_field``): a typo must not silently change what a consumer gets.  Item batches
are not control messages; they live in ``engine.protocol.frames`` (the JSON ``items`` message is
decoded here too, by delegation, so a client has one ``decode`` for every text frame).

Both directions use the type name ``barrier`` (client: "here is a cookie"; server: "your cookie
is done"), so decoding needs to know who sent the text: ``decode(text, sender=...)`` or the
shortcuts ``decode_client_message`` / ``decode_server_message``.

Server messages that a client surfaces as an event of the same concept carry a ``Message``
suffix (``StreamEndMessage``, ``BarrierReachedMessage``), so the wire message and the public event
(``clients.StreamEnd``, ``clients.BarrierReached``) never share a name.

Limits are explicit constants (names after DCP: a connection name of at most 200 characters) and
appear as ``maxLength``/``maxItems`` in the schema.  Per-connection limits that an operator may
tune (message size, pending cookies, window bounds) live in ``ProtocolLimits``.
"""
from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from dataclasses import fields as dc_fields
from typing import Any, ClassVar, TypeVar

from engine.protocol.errors import CloseCode, ErrorCode, ProtocolError
from engine.core.types import MAX_SEQNO, FailoverEntry

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
    "Hello",
    "Kind",
    "PartitionInfo",
    "ProtocolLimits",
    "Sender",
    "ServerMessage",
    "SnapshotMarker",
    "SnapshotSource",
    "StreamEndMessage",
    "StreamEndReason",
    "StreamRequest",
    "StreamResponse",
    "StreamStatus",
    "decode",
    "decode_client_message",
    "decode_server_message",
    "encode",
    "to_json_obj",
]

PROTOCOL_VERSION = 1
MAX_NAME_CHARS = 200  # DCP's connection-name limit
MAX_COOKIE_CHARS = 64
MAX_PARTITION_ID = 0xFFFF  # partitions travel as u16 in binary frames
MAX_PARTITIONS_LIST = MAX_PARTITION_ID + 1
MAX_FAILOVER_ENTRIES = 1000
MAX_TEXT_CHARS = 4096  # error/detail strings
MAX_WINDOW_BYTES = 1 << 40


@dataclass(frozen=True, slots=True)
class ProtocolLimits:
    """Per-connection limits the server enforces (configurable; defaults suit 64 partitions)."""

    #: Largest client text frame accepted (a hello naming 65,536 partitions fits).
    max_message_bytes: int = 1 << 20
    #: Cookies waiting for their barrier on one connection.
    max_pending_cookies: int = 1024
    #: Flow-control window used when hello sends ``window_bytes: null``.
    default_window_bytes: int = 16 << 20
    min_window_bytes: int = 4096
    max_window_bytes: int = 1 << 30


class Sender(str, enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class Codec(str, enum.Enum):
    """How item batches travel: ``binary`` frames (columnar, see frames.py) or JSON ``items``."""

    JSON = "json"
    BINARY = "binary"


class StreamStatus(str, enum.Enum):
    OK = "ok"
    ROLLBACK = "rollback"
    NOT_MY_PARTITION = "not_my_partition"
    RANGE_ERROR = "range_error"


class SnapshotSource(str, enum.Enum):
    DISK = "disk"
    MEMORY = "memory"


class StreamEndReason(str, enum.Enum):
    END_SEQNO_REACHED = "end_seqno_reached"
    STATE_CHANGED = "state_changed"
    SHUTTING_DOWN = "shutting_down"
    TOO_SLOW = "too_slow"
    CLOSED = "closed"


ROLLBACK_REASONS = ("unknown_uuid", "purged", "diverged", "partial_snapshot")  # engine.core.rollback.RollbackReason
PARTITION_STATES = ("active", "replica", "pending", "dead")  # engine.core.types.PartitionState


# ----------------------------------------------------------------------------- field kinds


def _bad(field: str, message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_FIELD, f"{field}: {message}", field=field)


class Kind:
    """How one field is checked, rendered and documented."""

    description: str = ""

    def load(self, value: Any, field: str) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        return value

    def schema(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError


class Int(Kind):
    def __init__(self, lo: int, hi: int, description: str = "") -> None:
        self.lo, self.hi, self.description = lo, hi, description

    def load(self, value: Any, field: str) -> int:
        if type(value) is not int:  # bool is an int subclass; refuse it and floats alike
            raise _bad(field, f"expected an integer, got {_json_type(value)}")
        if not self.lo <= value <= self.hi:
            raise _bad(field, f"{value} is outside {self.lo}..{self.hi}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.lo, "maximum": self.hi}


class Bool(Kind):
    def __init__(self, description: str = "") -> None:
        self.description = description

    def load(self, value: Any, field: str) -> bool:
        if type(value) is not bool:
            raise _bad(field, f"expected a boolean, got {_json_type(value)}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


class Str(Kind):
    def __init__(self, min_len: int, max_len: int, description: str = "") -> None:
        self.min_len, self.max_len, self.description = min_len, max_len, description

    def load(self, value: Any, field: str) -> str:
        if type(value) is not str:
            raise _bad(field, f"expected a string, got {_json_type(value)}")
        if not self.min_len <= len(value) <= self.max_len:
            raise _bad(field, f"length {len(value)} is outside {self.min_len}..{self.max_len} characters")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "minLength": self.min_len, "maxLength": self.max_len}


class Enum(Kind):
    def __init__(self, values: type[enum.Enum] | tuple[str, ...], description: str = "") -> None:
        self.enum_type = values if isinstance(values, type) else None
        self.values = tuple(v.value for v in values) if isinstance(values, type) else values
        self.description = description

    def load(self, value: Any, field: str) -> Any:
        if type(value) is not str or value not in self.values:
            raise _bad(field, f"expected one of {', '.join(self.values)}, got {value!r}"[:300])
        return self.enum_type(value) if self.enum_type else value

    def dump(self, value: Any) -> Any:
        return value.value if isinstance(value, enum.Enum) else value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}


class Nullable(Kind):
    def __init__(self, inner: Kind, description: str = "") -> None:
        self.inner, self.description = inner, description or inner.description

    def load(self, value: Any, field: str) -> Any:
        return None if value is None else self.inner.load(value, field)

    def dump(self, value: Any) -> Any:
        return None if value is None else self.inner.dump(value)

    def schema(self) -> dict[str, Any]:
        return {"oneOf": [self.inner.schema(), {"type": "null"}]}


class PartitionList(Kind):
    """A list of distinct partition ids (kept as a sorted tuple)."""

    def __init__(self, description: str = "") -> None:
        self.description = description

    def load(self, value: Any, field: str) -> tuple[int, ...]:
        if type(value) is not list:
            raise _bad(field, f"expected a list of partition ids, got {_json_type(value)}")
        if len(value) > MAX_PARTITIONS_LIST:
            raise _bad(field, f"{len(value)} partitions; at most {MAX_PARTITIONS_LIST}")
        item = Int(0, MAX_PARTITION_ID)
        ids = [item.load(v, f"{field}[{i}]") for i, v in enumerate(value)]
        if len(set(ids)) != len(ids):
            raise _bad(field, "partition ids must be distinct")
        return tuple(sorted(ids))

    def dump(self, value: Any) -> Any:
        return list(value)

    def schema(self) -> dict[str, Any]:
        return {
            "type": "array",
            "maxItems": MAX_PARTITIONS_LIST,
            "uniqueItems": True,
            "items": {"type": "integer", "minimum": 0, "maximum": MAX_PARTITION_ID},
        }


class FailoverLogKind(Kind):
    """``[[uuid, seqno], ...]`` newest first, as ``tuple[FailoverEntry, ...]``."""

    def __init__(self, description: str = "") -> None:
        self.description = description

    def load(self, value: Any, field: str) -> tuple[FailoverEntry, ...]:
        if type(value) is not list or len(value) > MAX_FAILOVER_ENTRIES:
            raise _bad(field, f"expected a list of at most {MAX_FAILOVER_ENTRIES} [uuid, seqno] pairs")
        out = []
        u64 = Int(0, MAX_SEQNO)
        for i, pair in enumerate(value):
            if type(pair) is not list or len(pair) != 2:
                raise _bad(f"{field}[{i}]", "expected a [uuid, seqno] pair")
            out.append(FailoverEntry(u64.load(pair[0], f"{field}[{i}][0]"), u64.load(pair[1], f"{field}[{i}][1]")))
        return tuple(out)

    def dump(self, value: Any) -> Any:
        return [[e.uuid, e.seqno] for e in value]

    def schema(self) -> dict[str, Any]:
        u64 = {"type": "integer", "minimum": 0, "maximum": MAX_SEQNO}
        return {
            "type": "array",
            "maxItems": MAX_FAILOVER_ENTRIES,
            "items": {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [u64, u64]},
        }


class PartitionMap(Kind):
    """A JSON object keyed by decimal partition id (JSON keys are strings), as ``dict[int, V]``."""

    def __init__(self, value: Kind, description: str = "") -> None:
        self.value, self.description = value, description

    def load(self, value: Any, field: str) -> dict[int, Any]:
        if type(value) is not dict:
            raise _bad(field, f"expected an object keyed by partition id, got {_json_type(value)}")
        if len(value) > MAX_PARTITIONS_LIST:
            raise _bad(field, f"more than {MAX_PARTITIONS_LIST} partitions")
        out: dict[int, Any] = {}
        for key, item in value.items():
            if not (key.isdigit() and key.isascii()) or int(key) > MAX_PARTITION_ID:
                raise _bad(f"{field}.{key}"[:100], "keys must be partition ids 0..65535")
            out[int(key)] = self.value.load(item, f"{field}.{key}")
        return out

    def dump(self, value: Any) -> Any:
        return {str(k): self.value.dump(v) for k, v in value.items()}

    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]{1,5}$"},
            "additionalProperties": self.value.schema(),
        }


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """What a client learns about one partition in ``failover_logs`` (and the session is told)."""

    state: str
    high_seqno: int
    purge_seqno: int
    log: tuple[FailoverEntry, ...]


class PartitionInfoKind(Kind):
    FIELDS: ClassVar[dict[str, Kind]] = {
        "state": Enum(PARTITION_STATES, "partition state"),
        "high_seqno": Int(0, MAX_SEQNO, "highest seqno assigned"),
        "purge_seqno": Int(0, MAX_SEQNO, "tombstones at or below this seqno may be purged"),
        "log": FailoverLogKind("failover log, newest first: [[uuid, seqno], ...]"),
    }

    def load(self, value: Any, field: str) -> PartitionInfo:
        if type(value) is not dict:
            raise _bad(field, f"expected an object, got {_json_type(value)}")
        return PartitionInfo(**_load_fields(self.FIELDS, value, field + ".", frozenset()))

    def dump(self, value: PartitionInfo) -> Any:
        return {name: kind.dump(getattr(value, name)) for name, kind in self.FIELDS.items()}

    def schema(self) -> dict[str, Any]:
        return _object_schema(self.FIELDS, required=list(self.FIELDS))


U64 = Int(0, MAX_SEQNO)
PARTITION = Int(0, MAX_PARTITION_ID, "partition id")


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


@message(
    "stream_request",
    Sender.CLIENT,
    partition=PARTITION,
    uuid=Int(0, MAX_SEQNO, "uuid of the failover entry the consumer last saw (0: none)"),
    start_seqno=Int(0, MAX_SEQNO, "last seqno the consumer has (stream starts after it)"),
    snap_start=Int(0, MAX_SEQNO, "start of the last snapshot the consumer received"),
    snap_end=Int(0, MAX_SEQNO, "end of the last snapshot the consumer received"),
    expected_state=Enum(("active", "replica"), "state the consumer expects the partition to be in"),
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
    expected_state: str = "active"
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


# ----------------------------------------------------------------------------- server -> client


@message(
    "failover_logs",
    Sender.SERVER,
    node_id=Str(1, MAX_NAME_CHARS, "stable id of the server's data dir"),
    partition_count=Int(1, MAX_PARTITION_ID + 1, "number of partitions of the keyspace"),
    partitions=PartitionMap(PartitionInfoKind(), "per requested partition: state, seqnos, failover log"),
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
    reason=Nullable(Enum(ROLLBACK_REASONS), "status rollback: the rule that decided it"),
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
    reason: str | None = None
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


# ----------------------------------------------------------------------------- encode / decode


def to_json_obj(msg: Any) -> dict[str, Any]:
    """The JSON object for a message (``type`` first)."""
    cls = type(msg)
    out: dict[str, Any] = {"type": cls.TYPE}
    for name, kind in cls.FIELDS.items():
        out[name] = kind.dump(getattr(msg, name))
    return out


def encode(msg: Any) -> str:
    """Render a control message as compact, pure-ASCII JSON text (so ``len(text)`` is its byte size)."""
    return json.dumps(to_json_obj(msg), separators=(",", ":"))


def decode(text: str | bytes, *, sender: Sender, max_bytes: int | None = None) -> Any:
    """Parse and validate one text frame from ``sender``; raise ``ProtocolError`` on any fault.

    Server-sent ``items`` messages decode to ``engine.protocol.frames.ItemBatch``.
    """
    if max_bytes is not None and len(text) > max_bytes:
        raise ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message of {len(text)} bytes exceeds the limit of {max_bytes}",
            close_code=CloseCode.MESSAGE_TOO_BIG,
        )
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(ErrorCode.MALFORMED_JSON, f"malformed JSON: {exc}"[:300]) from None
    except RecursionError:
        raise ProtocolError(ErrorCode.MALFORMED_JSON, "malformed JSON: nested too deeply") from None
    return decode_obj(obj, sender=sender)


def decode_obj(obj: Any, *, sender: Sender) -> Any:
    """Validate an already parsed JSON value as a message from ``sender``."""
    if type(obj) is not dict:
        raise ProtocolError(ErrorCode.NOT_AN_OBJECT, f"a message must be a JSON object, got {_json_type(obj)}")
    type_name = obj.get("type", MISSING)
    if type_name is MISSING:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "missing field 'type'", field="type")
    if type(type_name) is not str:
        raise ProtocolError(ErrorCode.INVALID_FIELD, "type: expected a string", field="type")
    registry = CLIENT_MESSAGES if sender is Sender.CLIENT else SERVER_MESSAGES
    cls = registry.get(type_name)
    if cls is None:
        if sender is Sender.SERVER and type_name == "items":
            from engine.protocol.frames import json_obj_to_batch

            return json_obj_to_batch(obj)
        known = ", ".join(sorted(registry))
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {type_name[:64]!r}; expected one of {known}", field="type"
        )
    return cls(**_load_fields(cls.FIELDS, obj, "", cls.OPTIONAL, skip=("type",)))


def decode_client_message(text: str | bytes, *, max_bytes: int | None = None) -> Any:
    return decode(text, sender=Sender.CLIENT, max_bytes=max_bytes)


def decode_server_message(text: str | bytes) -> Any:
    return decode(text, sender=Sender.SERVER)


def _load_fields(
    kinds: Mapping[str, Kind],
    obj: Mapping[str, Any],
    prefix: str,
    optional: frozenset[str],
    skip: tuple[str, ...] = (),
) -> dict[str, Any]:
    for key in obj:
        if key not in kinds and key not in skip:
            raise ProtocolError(
                ErrorCode.UNKNOWN_FIELD, f"unknown field {prefix}{key[:64]!r}", field=f"{prefix}{key[:64]}"
            )
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        if name in obj:
            out[name] = kind.load(obj[name], prefix + name)
        elif name not in optional:
            raise ProtocolError(ErrorCode.MISSING_FIELD, f"missing field {prefix}{name!r}", field=prefix + name)
    return out


def _object_schema(kinds: Mapping[str, Kind], required: list[str]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, kind in kinds.items():
        schema = kind.schema()
        if kind.description:
            schema = {"description": kind.description, **schema}
        props[name] = schema
    return {"type": "object", "additionalProperties": False, "required": required, "properties": props}


def message_schema(cls: type) -> dict[str, Any]:
    """JSON Schema of one message type, as used in ``openapi/asyncapi.yaml``."""
    fields = dict(cls.FIELDS)  # type: ignore[attr-defined]
    schema = _object_schema(fields, required=["type", *[n for n in fields if n not in cls.OPTIONAL]])  # type: ignore[attr-defined]
    schema["properties"] = {"type": {"type": "string", "const": cls.TYPE}, **schema["properties"]}  # type: ignore[attr-defined]
    return schema


def _json_type(value: Any) -> str:
    return {
        bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)
