"""The stream protocol's control messages and their JSON codec: one import for every peer.

Server, clients and Spark speak the protocol through this module (``from engine.protocol
import messages as M``; ``M.Hello``, ``M.encode``, ``M.decode_server_message``).  It defines
nothing itself; each concept has its own module, read in this order:

* ``engine.protocol.limits``: fixed wire limits and the tunable per-connection ``ProtocolLimits``;
* ``engine.protocol.fields``: field kinds, the one description of a field that decodes, encodes
  and documents it;
* ``engine.protocol.message_types``: the message dataclasses and their enums, registered per
  direction;
* ``engine.protocol.encoding``: JSON text to a validated message and back;
* ``engine.protocol.schema``: the JSON Schema of each message for ``openapi/asyncapi.yaml``.

Item batches are not control messages; they live in ``engine.protocol.frames``.
"""
from __future__ import annotations

from engine.protocol.encoding import (
    decode,
    decode_client_message,
    decode_obj,
    decode_server_message,
    encode,
    to_json_obj,
)
from engine.protocol.fields import Kind
from engine.protocol.limits import (
    MAX_COOKIE_CHARS,
    MAX_FAILOVER_ENTRIES,
    MAX_NAME_CHARS,
    MAX_PARTITION_ID,
    MAX_PARTITIONS_LIST,
    MAX_TEXT_CHARS,
    MAX_WINDOW_BYTES,
    ProtocolLimits,
)
from engine.protocol.message_types import (
    CLIENT_MESSAGES,
    PROTOCOL_VERSION,
    SERVER_MESSAGES,
    Ack,
    Barrier,
    BarrierReachedMessage,
    ClientMessage,
    CloseStream,
    Codec,
    CycleComplete,
    Error,
    FailoverLogs,
    Frames,
    Hello,
    PartitionInfo,
    SeqnoAck,
    Sender,
    ServerMessage,
    SnapshotMarker,
    SnapshotSource,
    StreamEndMessage,
    StreamEndReason,
    StreamRequest,
    StreamResponse,
    StreamStatus,
    Visibility,
)
from engine.protocol.schema import message_schema

__all__ = [
    "CLIENT_MESSAGES",
    "MAX_COOKIE_CHARS",
    "MAX_FAILOVER_ENTRIES",
    "MAX_NAME_CHARS",
    "MAX_PARTITIONS_LIST",
    "MAX_PARTITION_ID",
    "MAX_TEXT_CHARS",
    "MAX_WINDOW_BYTES",
    "PROTOCOL_VERSION",
    "SERVER_MESSAGES",
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
    "Kind",
    "PartitionInfo",
    "ProtocolLimits",
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
    "decode",
    "decode_client_message",
    "decode_obj",
    "decode_server_message",
    "encode",
    "message_schema",
    "to_json_obj",
]
