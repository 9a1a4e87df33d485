"""The per-partition position state machine; defined in the pure layer
(``engine.protocol.client.position``) beside the client protocol session that drives it."""
from engine.protocol.client.position import PartitionPosition, PositionState

__all__ = ["PositionState", "PartitionPosition"]
