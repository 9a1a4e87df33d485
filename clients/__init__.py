"""upr's Python client: a resumable change-feed consumer with rollback repair, and the HTTP API.

Builds only on engine's pure parts (types, errors, protocol); never imports the server.
"""
from engine.protocol.client.actions import RollbackPolicy
from engine.protocol.client.offset import StreamOffset

from .consumer import Consumer
from .errors import (
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
from .events import (
    BarrierReached,
    Deletion,
    Event,
    Mutation,
    PartitionReset,
    Rollback,
    SnapshotEnd,
    SnapshotStart,
    StreamEnd,
)
from .http import AsyncHttpApi, HttpApi
from .ring import RollbackRing
from .state import ConsumerState, FileStateStore, MemoryStateStore, PartitionCheckpoint, StateStore
from .sync import SyncConsumer

__all__ = [
    "AsyncHttpApi",
    "AuthFailed",
    "BarrierReached",
    "ClientError",
    "ConnectionFailed",
    "Consumer",
    "ConsumerState",
    "Deletion",
    "Event",
    "FileStateStore",
    "HttpApi",
    "HttpError",
    "MemoryStateStore",
    "Mutation",
    "PartitionCheckpoint",
    "PartitionReset",
    "ProtocolViolation",
    "Rollback",
    "RollbackPolicy",
    "RollbackRing",
    "ServerError",
    "SnapshotEnd",
    "SnapshotStart",
    "StateCorrupt",
    "StateStore",
    "StreamEnd",
    "StreamOffset",
    "StreamRejected",
    "SyncConsumer",
    "UsageError",
]
