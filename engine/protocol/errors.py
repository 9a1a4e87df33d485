"""The stream protocol's one error type and the WebSocket close codes it maps to.

    UprError (engine.core.errors)
    └── ProtocolError        a peer broke the stream protocol; ``code`` says how, ``field`` where

A ``ProtocolError`` is rendered as an ``error`` message (``code``, ``message``, ``field``,
``partition``) and, when ``close_code`` is set, the connection is closed with that WebSocket code.
Errors about one stream (a refused partition, a duplicate stream) leave ``close_code`` None: the
connection and its other streams carry on.
"""
from __future__ import annotations

import enum

from engine.core.errors import UprError

__all__ = ["CloseCode", "ErrorCode", "ProtocolError"]


class CloseCode(enum.IntEnum):
    """WebSocket close codes (RFC 6455 §7.4.1) the protocol uses."""

    NORMAL = 1000
    GOING_AWAY = 1001  # server shutting down
    UNSUPPORTED_DATA = 1003  # binary frame from the client, unsupported protocol version or codec
    PROTOCOL_ERROR = 1008  # policy violation: malformed or out-of-order message
    MESSAGE_TOO_BIG = 1009


class ErrorCode(enum.StrEnum):
    """Stable machine-readable codes carried by ``error`` messages."""

    MALFORMED_JSON = "malformed_json"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_TYPE = "unknown_type"
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"
    INVALID_FIELD = "invalid_field"
    MESSAGE_TOO_LARGE = "message_too_large"
    UNSUPPORTED_DATA = "unsupported_data"
    UNSUPPORTED_PROTOCOL = "unsupported_protocol"
    WRONG_ORDER = "wrong_order"
    DUPLICATE_HELLO = "duplicate_hello"
    HELLO_TIMEOUT = "hello_timeout"
    INVALID_PARTITION = "invalid_partition"
    PARTITION_NOT_REQUESTED = "partition_not_requested"
    DUPLICATE_STREAM = "duplicate_stream"
    STREAM_NOT_OPEN = "stream_not_open"
    DUPLICATE_COOKIE = "duplicate_cookie"
    TOO_MANY_COOKIES = "too_many_cookies"
    ACK_EXCEEDS_IN_FLIGHT = "ack_exceeds_in_flight"
    NOT_REPLICATION = "not_replication"
    REPLICATION_FORBIDDEN = "replication_forbidden"
    CORRUPT_FRAME = "corrupt_frame"
    CONNECTION_CLOSED = "connection_closed"


class ProtocolError(UprError):
    """A peer sent something the protocol does not allow.

    ``code`` is an ``ErrorCode`` value (instance attribute, unlike other ``UprError`` classes
    whose code is fixed per class); ``close_code`` None means "refuse this request only".
    """

    code = "protocol_error"

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        field: str | None = None,
        partition: int | None = None,
        close_code: CloseCode | None = CloseCode.PROTOCOL_ERROR,
    ) -> None:
        super().__init__(message, field=field, partition=partition)
        self.code = code.value  # type: ignore[misc]
        self.error_code = code
        self.close_code = close_code

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.message!r}, field={self.field!r}, close={self.close_code})"
