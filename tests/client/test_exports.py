"""The public API is explicit and pinned (httpx's test_exported_members habit).

``__all__`` must be exactly the package's public members, so a name imported into
``clients/__init__.py`` without being exported (or exported without being defined) fails here,
and the pinned set makes every change to the public API a visible edit of this file."""
from types import ModuleType

import clients

EXPECTED = {
    "AsyncHttpApi", "AuthFailed", "BarrierReached", "ClientError", "ConnectionFailed", "Consumer", "ConsumerState",
    "Deletion", "Event", "FileStateStore", "HttpApi", "HttpError", "MemoryStateStore", "Mutation",
    "PartitionCheckpoint", "PartitionReset", "ProtocolViolation", "Rollback", "RollbackPolicy", "RollbackRing", "ServerError",
    "SnapshotEnd", "SnapshotStart", "StateCorrupt", "StateStore", "StreamEnd", "StreamOffset", "StreamRejected",
    "SyncConsumer", "UsageError",
}


def test_exported_members():
    assert set(clients.__all__) == EXPECTED
    assert len(clients.__all__) == len(EXPECTED), "a name is listed twice in __all__"


def test_all_is_exactly_the_public_members_in_order():
    # submodules are reachable as clients.<name> because they were imported; they are not API members
    public = [name for name, value in vars(clients).items()
              if not name.startswith("_") and not isinstance(value, ModuleType)]
    assert clients.__all__ == sorted(public, key=str.casefold)


def test_star_import_gives_exactly_the_pinned_names():
    namespace: dict[str, object] = {}
    exec("from clients import *", namespace)
    assert set(namespace) - {"__builtins__"} == EXPECTED


def test_errors_are_upr_errors():
    from engine.core.errors import UprError

    for name in ("AuthFailed", "ConnectionFailed", "HttpError", "ProtocolViolation", "ServerError", "StateCorrupt",
                 "StreamRejected", "UsageError"):
        assert issubclass(getattr(clients, name), clients.ClientError)
        assert issubclass(getattr(clients, name), UprError)
    assert clients.ConnectionFailed.retriable and not clients.AuthFailed.retriable
