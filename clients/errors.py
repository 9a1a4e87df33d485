"""The client's error tree (defined in the pure layer, ``engine.protocol.client.errors``, because the
client protocol session raises it too; see there for the tree)."""
from engine.protocol.client.errors import (
    AuthFailed,
    ClientError,
    ConnectionFailed,
    HttpError,
    ProtocolViolation,
    ServerError,
    StateCorrupt,
    StreamRejected,
    UsageError,
)

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
