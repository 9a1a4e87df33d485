"""The client's error tree, grafted onto ``engine.core.errors.UprError`` so one ``except UprError`` catches all.

    UprError (engine.core.errors)
    └── ClientError                 anything the client library raises on purpose
        ├── ConnectionFailed        server unreachable / connection lost; retriable
        ├── AuthFailed              token missing, wrong or without the needed role (HTTP 401/403)
        ├── HttpError               any other non-2xx answer of the HTTP API (``status``, ``code``)
        ├── ProtocolViolation       the server sent something the protocol forbids (a bug on one side)
        ├── ServerError             the server sent an ``error`` message (``code``, ``field``)
        ├── StreamRejected          a stream request got ``range_error`` or a persistent ``not_my_partition``
        ├── StateCorrupt            a saved state or ring file cannot be trusted
        └── UsageError              the API was called in a way that cannot work

Errors carry data (partition, seqno, code, status) so callers and the CLI can render them
without parsing messages (the httpx / aiokafka habit).
"""
from __future__ import annotations

from engine.core.errors import UprError

__all__ = [
    "ClientError",
    "ConnectionFailed",
    "AuthFailed",
    "HttpError",
    "ProtocolViolation",
    "ServerError",
    "StreamRejected",
    "StateCorrupt",
    "UsageError",
]


class ClientError(UprError):
    code = "client_error"


class ConnectionFailed(ClientError):
    code = "connection_failed"
    retriable = True


class AuthFailed(ClientError):
    code = "auth_failed"


class HttpError(ClientError):
    code = "http_error"

    def __init__(self, message: str, *, status: int, server_code: str | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.status = status
        self.server_code = server_code


class ProtocolViolation(ClientError):
    code = "protocol_violation"


class ServerError(ClientError):
    code = "server_error"

    def __init__(self, message: str, *, server_code: str, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.server_code = server_code


class StreamRejected(ClientError):
    code = "stream_rejected"

    def __init__(self, message: str, *, status: str, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.status = status


class StateCorrupt(ClientError):
    code = "state_corrupt"


class UsageError(ClientError):
    code = "usage_error"
