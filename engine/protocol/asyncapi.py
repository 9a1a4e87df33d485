"""The AsyncAPI 3.0 description of the stream protocol, built from the message definitions.

``openapi/asyncapi.yaml`` is this document rendered as YAML.  It is derived, not hand-written, so
it cannot drift from the code: ``tests/protocol/test_asyncapi.py`` checks that the file equals
``build_document()`` and that every example message validates against its schema.  After changing
a message, regenerate it with::

    UPDATE_ASYNCAPI=1 .venv/bin/pytest tests/protocol/test_asyncapi.py

Standard library only (the YAML rendering happens in the test, with PyYAML).
"""
from __future__ import annotations

import inspect
from typing import Any

from engine.core.types import MAX_SEQNO
from engine.protocol import bundle, frames, packed
from engine.protocol.errors import CloseCode, ErrorCode
from engine.protocol.limits import MAX_PARTITION_ID
from engine.protocol.message_types import CLIENT_MESSAGES, PROTOCOL_VERSION, SERVER_MESSAGES
from engine.protocol.schema import message_schema

__all__ = ["ITEMS_JSON_SCHEMA", "build_document", "component_name"]

_U64 = {"type": "integer", "minimum": 0, "maximum": MAX_SEQNO}

ITEMS_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": list(frames.JSON_FIELDS),
    "properties": {
        "type": {"type": "string", "const": "items"},
        "partition": {"type": "integer", "minimum": 0, "maximum": MAX_PARTITION_ID},
        "last": {"description": "this batch completes its snapshot", "type": "boolean"},
        "seqnos": {"type": "array", "items": _U64},
        "cas": {"type": "array", "items": _U64},
        "revs": {"type": "array", "items": _U64},
        "deleted": {"type": "array", "items": {"type": "integer", "enum": [0, 1]}},
        "keys": {"description": "UTF-8 keys", "type": "array", "items": {"type": "string"}},
        "values": {"description": "values, base64 (empty for deletions)", "type": "array",
                   "items": {"type": "string", "contentEncoding": "base64"}},
    },
}

_DESCRIPTION = """\
One WebSocket connection (GET /stream, bearer token with the `read` role checked before the
upgrade) streams any set of partitions to one consumer, in the line of Couchbase UPR/DCP.

Conversation: the client sends `hello` (exactly once, first); the server answers `failover_logs`.
The client sends one `stream_request` per partition with its saved position (uuid, start seqno,
snapshot range); the server answers `stream_response` per partition: ok, rollback (with the rule
that decided it: unknown_uuid, purged, diverged, partial_snapshot), not_my_partition or
range_error (naming the field).  The server then walks the open streams in partition id order:
for each one with news it sends `snapshot` and item batches (binary frames or JSON `items`), and
`cycle_complete` at the end of each pass.  `barrier` cookies come back once every stream was
visited after the cookie arrived, with the per-partition positions: a consistent cut.

Visibility: `hello` `visibility` chooses which writes the connection's streams deliver: `memory`
(default, every write once queued), `persisted` (never above the partition's persisted seqno, so
an unclean restart never makes the consumer roll back) or `majority` (never above what a majority
of the partition's copies hold, so a failover never does; on a node without a cluster it streams
as `memory`).  Snapshots are sent whole and only once their end is visible, so a marker never
promises a seqno the consumer will not get, and a `barrier` cookie comes back only once
everything written before it is delivered, hence visible: it waits for the flush or the replicas.

Bundles: a client that sends `hello` with `bundle: true` may receive several of these messages
(e.g. a pass's snapshot markers and item batches) in one binary `bundle` message, in the order
they would otherwise have been sent; it counts as one frame of its full size for flow control.

Packed passes: a client that sends `hello` with `frames: "packed"` (and `codec: "binary"`,
`bundle: true`) may receive a run of a pass's snapshot markers and item batches as one `packed`
pass (alone or as a binary part of a bundle): per batch a section with the fields of the marker
before it and the batch frame.  It stands for those messages in that order; plain markers and
batches may still come, and control messages never travel inside a packed pass.

Flow control: every frame the server sends after `hello` counts against the client's window
(text frames are ASCII, so characters = bytes); the client acknowledges processed bytes with
`ack`.  Position rule: after the last batch of a snapshot (`last` true) the consumer holds the
whole snapshot, so its position is (uuid, start_seqno = end, snap_start = start, snap_end = end);
mid-snapshot it is (uuid, last seqno processed, start, end).

Close codes: 1000 normal, 1001 server shutting down, 1003 unsupported data (binary frame from a
client, unless a bundle of text messages after hello `bundle: true`; unsupported protocol version), 1008 protocol error (preceded by an `error` message naming
the code and field), 1009 message too big.  Keep-alive: WebSocket ping/pong.
"""


def component_name(cls: type) -> str:
    """Unique component name: the wire type, with ``barrier_reached`` for the server's barrier."""
    return "barrier_reached" if cls.SENDER.value == "server" and cls.TYPE == "barrier" else cls.TYPE  # type: ignore[attr-defined]


def _message(cls: type) -> dict[str, Any]:
    doc = inspect.getdoc(cls) or ""
    return {
        "name": cls.TYPE,  # type: ignore[attr-defined]
        "title": cls.__name__,
        "summary": doc.splitlines()[0] if doc else cls.__name__,
        "contentType": "application/json",
        "payload": message_schema(cls),
    }


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def build_document() -> dict[str, Any]:
    """The whole AsyncAPI 3.0 document as plain JSON-compatible data."""
    messages: dict[str, Any] = {}
    for cls in CLIENT_MESSAGES.values():
        messages[component_name(cls)] = _message(cls)
    for cls in SERVER_MESSAGES.values():
        messages[component_name(cls)] = _message(cls)
    messages["items"] = {
        "name": "items",
        "title": "ItemBatch (JSON codec)",
        "summary": "A batch of one partition's items as columns (hello codec json).",
        "contentType": "application/json",
        "payload": ITEMS_JSON_SCHEMA,
    }
    messages["items_binary"] = {
        "name": "items_binary",
        "title": "ItemBatch (binary codec)",
        "summary": "A batch of one partition's items as a binary frame (hello codec binary).",
        "description": "Binary codec " + _between(inspect.getdoc(frames) or "", "Binary codec", "JSON codec"),
        "contentType": "application/octet-stream",
        "payload": {"type": "string", "format": "binary"},
    }
    messages["bundle"] = {
        "name": "bundle",
        "title": "Bundle (hello bundle true)",
        "summary": "Several server messages, in order, in one binary message.",
        "description": "Layout, " + _between(inspect.getdoc(bundle) or "", "Layout,", "``Bundler``"),
        "contentType": "application/octet-stream",
        "payload": {"type": "string", "format": "binary"},
    }
    messages["packed"] = {
        "name": "packed",
        "title": "Packed pass (hello frames packed)",
        "summary": "A pass's snapshot markers and item batches, in order, in one binary message part.",
        "description": "Layout, " + _between(inspect.getdoc(packed) or "", "Layout,", "WHY the batch frame"),
        "contentType": "application/octet-stream",
        "payload": {"type": "string", "format": "binary"},
    }
    client = [component_name(c) for c in CLIENT_MESSAGES.values()]
    server = [component_name(c) for c in SERVER_MESSAGES.values()] + ["items", "items_binary", "bundle", "packed"]
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "upr stream protocol",
            "version": str(PROTOCOL_VERSION),
            "description": _DESCRIPTION,
        },
        "servers": {
            "local": {"host": "127.0.0.1:8000", "protocol": "ws", "description": "upr server --port 8000"},
        },
        "channels": {
            "stream": {
                "address": "/stream",
                "description": "One consumer's change stream over any set of partitions.",
                "messages": {name: {"$ref": f"#/components/messages/{name}"} for name in client + server},
                "bindings": {"ws": {"method": "GET", "bindingVersion": "0.1.0"}},
            }
        },
        "operations": {
            "receiveClientMessages": {
                "action": "receive",
                "summary": "Control messages the server accepts (JSON text frames).",
                "channel": {"$ref": "#/channels/stream"},
                "messages": [{"$ref": f"#/channels/stream/messages/{name}"} for name in client],
            },
            "sendServerMessages": {
                "action": "send",
                "summary": "Control messages and item batches the server sends.",
                "channel": {"$ref": "#/channels/stream"},
                "messages": [{"$ref": f"#/channels/stream/messages/{name}"} for name in server],
            },
        },
        "components": {
            "messages": messages,
            "schemas": {
                "ErrorCode": {"type": "string", "enum": [c.value for c in ErrorCode]},
                "CloseCode": {"type": "integer", "enum": [int(c) for c in CloseCode]},
            },
        },
    }
