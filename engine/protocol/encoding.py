"""Control messages to and from JSON text: the one place a text frame is parsed or rendered.

Decoding is strict because a consumer's correctness depends on what it was told: the text must
be one JSON object whose ``type`` names a message of the sender's direction, with every required
field, no unknown field, and each field valid for its kind; anything else is a ``ProtocolError``
with a stable code and the offending (dotted) field.  Item batches are not control messages (they
live in ``engine.protocol.frames``), but a server's JSON ``items`` message decodes here too, by
delegation, so a client has one ``decode`` for every text frame.

Encoding renders compact, pure-ASCII JSON, so a text frame's length in characters is the byte
count flow control charges for it.
"""
from __future__ import annotations

import json
from dataclasses import MISSING
from typing import Any

from engine.protocol.errors import CloseCode, ErrorCode, ProtocolError
from engine.protocol.fields import json_type, load_fields
from engine.protocol.frames import json_obj_to_batch
from engine.protocol.json_text import parse_json
from engine.protocol.message_types import CLIENT_MESSAGES, SERVER_MESSAGES, Sender

__all__ = [
    "decode",
    "decode_client_message",
    "decode_obj",
    "decode_server_message",
    "encode",
    "to_json_obj",
]


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
    return decode_obj(parse_json(text), sender=sender)


def decode_obj(obj: Any, *, sender: Sender) -> Any:
    """Validate an already parsed JSON value as a message from ``sender``."""
    if type(obj) is not dict:
        raise ProtocolError(ErrorCode.NOT_AN_OBJECT, f"a message must be a JSON object, got {json_type(obj)}")
    type_name = obj.get("type", MISSING)
    if type_name is MISSING:
        raise ProtocolError(ErrorCode.MISSING_FIELD, "missing field 'type'", field="type")
    if type(type_name) is not str:
        raise ProtocolError(ErrorCode.INVALID_FIELD, "type: expected a string", field="type")
    registry = CLIENT_MESSAGES if sender is Sender.CLIENT else SERVER_MESSAGES
    cls = registry.get(type_name)
    if cls is None:
        if sender is Sender.SERVER and type_name == "items":
            return json_obj_to_batch(obj)
        known = ", ".join(sorted(registry))
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {type_name[:64]!r}; expected one of {known}", field="type"
        )
    return cls(**load_fields(cls.FIELDS, obj, "", cls.OPTIONAL, skip=("type",)))


def decode_client_message(text: str | bytes, *, max_bytes: int | None = None) -> Any:
    return decode(text, sender=Sender.CLIENT, max_bytes=max_bytes)


def decode_server_message(text: str | bytes) -> Any:
    return decode(text, sender=Sender.SERVER)
