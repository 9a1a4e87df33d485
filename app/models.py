"""Request and response shapes, for validation where it is cheap and for the OpenAPI document.

Hot paths (document writes, bulk) encode their responses with orjson directly and
only *declare* these models, because building a pydantic object per response costs
a large share of a small request; shapes are kept identical and a test validates
live responses against the published schema.
"""
from __future__ import annotations

from typing import Annotated, Literal

from annotated_types import Ge, Le
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, StringConstraints

from engine.core.types import MAX_SEQNO, PartitionState


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(description="stable URI naming the kind of problem", examples=["https://upr.dev/problems/cas-mismatch"])
    title: str
    status: int
    detail: str
    instance: str | None = None
    field: str | None = Field(None, description="the offending input (body field, header, query parameter)")
    partition: int | None = Field(None, description="the partition concerned, when there is one")


class WriteResult(BaseModel):
    key: str
    partition: int = Field(description="partition that owns the key")
    seqno: int = Field(description="sequence number of this change within its partition")
    cas: int = Field(description="CAS of the new version; pass as If-Match (or bulk `cas`) to update it safely")
    rev: int = Field(description="revision: how many times the key has changed")
    deleted: bool
    durability: Literal["memory", "persist", "majority", "persist_majority"]


class BulkItem(BaseModel):
    """One operation of ``POST /docs/_bulk`` (one array element or one NDJSON line)."""

    op: Literal["set", "delete"]
    key: str
    value: object | None = Field(None, description="any JSON value, stored as its JSON text exactly as sent"
                                 " (whitespace and escapes kept)")
    value_b64: str | None = Field(None, description="binary value, base64 (instead of `value`)")
    cas: int | None = Field(None, description="compare-and-swap against this CAS (0 or absent: no check)")


class BulkItemResult(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int = Field(description="position of the item in the request")
    status: int = Field(description="200 ok, or the HTTP status the item alone would have had")
    key: str | None = None
    partition: int | None = None
    seqno: int | None = None
    cas: int | None = None
    rev: int | None = None
    deleted: bool | None = None
    error: Problem | None = None


class BulkResult(BaseModel):
    """``?results=objects`` (the default): one object per item, in item order."""

    durability: Literal["memory", "persist", "majority", "persist_majority"]
    succeeded: int
    failed: int
    results: list[BulkItemResult]


class BulkColumns(BaseModel):
    """Element ``i`` of each array belongs to item ``i``; all arrays have one element per item."""

    status: list[int] = Field(description="200 ok, or the HTTP status the item alone would have had")
    partition: list[int | None] = Field(description="partition of a written item (null if it failed)")
    seqno: list[int | None] = Field(description="its seqno within that partition (null if it failed)")
    cas: list[int | None] = Field(description="its new CAS (null if it failed)")
    rev: list[int | None] = Field(description="its revision (null if it failed)")
    deleted: list[bool | None] = Field(description="true for a delete (null if it failed)")


class BulkColumnsResult(BaseModel):
    """``?results=columns``: the same per-item outcome as ``BulkResult`` as one array per field
    (no keys: they are the request's, in order), plus the failed items with their problems."""

    durability: Literal["memory", "persist", "majority", "persist_majority"]
    succeeded: int
    failed: int
    columns: BulkColumns
    errors: list[BulkItemResult] = Field(description="every failed item (index, status, key if known, problem)")


class FailoverEntry(BaseModel):
    uuid: int
    seqno: int


class PartitionStatus(BaseModel):
    partition: int
    state: PartitionState
    uuid: int = Field(description="current branch (newest failover entry)")
    high_seqno: int
    persisted_seqno: int
    purge_seqno: int = Field(description="tombstones at or below this seqno may be gone; consumers behind it roll back")
    item_count: int
    queue_depth: int
    queue_bytes: int
    failover_log: list[FailoverEntry] = Field(description="newest first")


class PartitionList(BaseModel):
    partitions: list[PartitionStatus]


class Totals(BaseModel):
    items: int
    high_seqno: int = Field(description="sum over partitions")
    persisted_seqno: int = Field(description="sum over partitions")
    queue_depth: int
    queue_bytes: int
    flush_rate: float = Field(description="flushes per second recently")
    streams_connected: int


class Status(BaseModel):
    node_id: str
    version: str
    uptime_s: float
    partitions: int
    protected_mode: bool
    totals: Totals
    engine: dict[str, float] = Field(description="raw engine counters")


class PartitionStreamStatus(BaseModel):
    partition: int
    last_sent_seqno: int
    lag: int = Field(description="high seqno minus last sent seqno")
    purge_seqno: int = Field(0, description="the partition's purge seqno at the stream's last snapshot")
    purge_distance: int = Field(
        0, description="last sent seqno minus purge seqno; near or below 0 a resume would roll back to 0"
    )


class StreamInfo(BaseModel):
    id: int
    name: str
    kind: Literal["consumer", "replication"] = Field(
        "consumer", description="replication: another node's replica copy (hello name 'replication:<node>')")
    remote: str
    codec: str
    connected_at: float
    partitions: list[PartitionStreamStatus]
    bytes_buffered: int = Field(description="sent but not yet acknowledged (flow-control window use)")
    barriers_pending: int
    window_bytes: int = Field(0, description="flow-control window the consumer asked for")
    cursor_drops: int = Field(0, description="snapshots released because the consumer stalled")
    rollbacks: int = Field(0, description="rollbacks this connection was told to do")


class StreamList(BaseModel):
    streams: list[StreamInfo]


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    ready: bool
    engine_open: bool
    flusher_running: bool
    flush_failing: bool = Field(
        False, description="present (true) while flushing to disk fails (e.g. disk full): writes are not persisted")
    reason: str | None = Field(None, description="present when not ready: why")


class StateChange(BaseModel):
    state: PartitionState


PartitionKey = Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]{0,3})$")]


def _json_integer(value: object) -> object:
    """JSON Schema's integer: 7 or 7.0, never true or "7" (pydantic's lax mode takes both)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be an integer")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("must be an integer")
    return int(value)


#: Bounded by 2**53 - 1 (JSON's safe-integer limit) rather than the engine's 2**64 - 1: JSON tools
#: compare numbers as floats, and near any larger bound several integers round to the bound's float,
#: so a client and the server would disagree about which values are valid (schemathesis found
#: 2**63 + 191 "valid" by the schema and rejected by us).  No partition reaches 2**53 seqnos.
MAX_JSON_SEQNO = (1 << 53) - 1
Seqno = Annotated[int, Ge(0), Le(MAX_JSON_SEQNO), BeforeValidator(_json_integer)]
#: A full unsigned 64-bit value (a uuid, or a seqno the stream protocol carries), same integer rule.
U64 = Annotated[int, Ge(0), Le(MAX_SEQNO), BeforeValidator(_json_integer)]
U16 = Annotated[int, Ge(0), Le(0xFFFF), BeforeValidator(_json_integer)]
#: true or false only (pydantic's lax mode also takes 0, 1, "yes", "off"...)
StrictBool = Annotated[bool, Strict()]


class CompactRequest(BaseModel):
    """At least one of the two; with both, a tombstone must satisfy both to be purged.
    (Fields are typed without ``None`` so the schema does not offer ``null``.)"""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"anyOf": [{"required": ["purge_before_seqno"]}, {"required": ["older_than_s"]}]},
    )
    purge_before_seqno: dict[PartitionKey, Seqno] = Field(
        None,  # type: ignore[assignment]
        description='per partition ("7": seqno): purge tombstones with seqno below this',
        json_schema_extra={"additionalProperties": False},
    )
    older_than_s: float = Field(
        None,  # type: ignore[assignment]
        ge=0, le=1e10, strict=True, description="purge tombstones older than this many seconds",
    )


class CompactResult(BaseModel):
    purge_seqnos: dict[int, int] = Field(description="new purge seqno per partition")


class FlushResult(BaseModel):
    flushed: bool
    duration_s: float
    persisted_seqnos: dict[int, int]
