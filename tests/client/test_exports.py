"""The public API is explicit and pinned (httpx's test_exported_members habit)."""
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
    for name in clients.__all__:
        assert getattr(clients, name) is not None


def test_errors_are_upr_errors():
    from engine.core.errors import UprError

    for name in ("AuthFailed", "ConnectionFailed", "HttpError", "ProtocolViolation", "ServerError", "StateCorrupt",
                 "StreamRejected", "UsageError"):
        assert issubclass(getattr(clients, name), clients.ClientError)
        assert issubclass(getattr(clients, name), UprError)
    assert clients.ConnectionFailed.retriable and not clients.AuthFailed.retriable
