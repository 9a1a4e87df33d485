"""The client protocol session (sans-I/O), defined in the pure layer (``engine.protocol.client``) so
that every stream reader shares it: the consumer, the Spark task and replica streams in the server."""
from engine.protocol.client.actions import (
    UNSAVED_PROGRESS,
    EndAction,
    RollbackPlan,
    RollbackPolicy,
    SeekAction,
    StartMode,
)
from engine.protocol.client.session import ClientSession

__all__ = ["StartMode", "RollbackPolicy", "RollbackPlan", "EndAction", "SeekAction", "ClientSession",
           "UNSAVED_PROGRESS"]
