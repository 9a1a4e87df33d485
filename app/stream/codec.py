"""The connection's codec: how markers, item batches and stream ends become WebSocket messages.

Control messages use ``engine.protocol.messages`` (the one definition shared with clients).  Item
batches use ``engine.protocol.frames`` (binary columnar frames or JSON ``items`` messages), so
the consumer does as little per-item work as possible.  Encoding runs in executor threads.
"""
from __future__ import annotations

from engine.protocol import frames as F
from engine.protocol import messages as M
from engine.types import Item

from app.stream.cursor import Encoder

__all__ = ["BinaryEncoder", "JsonEncoder", "encoder_for"]


class _Control(Encoder):
    def marker(self, partition: int, start: int, end: int, source: str, purge_seqno: int) -> str:
        return M.encode(M.SnapshotMarker(partition, start, end, M.SnapshotSource(source), purge_seqno))

    def stream_end(self, partition: int, reason: str, last_seqno: int) -> str:
        return M.encode(M.StreamEnd(partition, M.StreamEndReason(reason), last_seqno))


class JsonEncoder(_Control):
    def items(self, partition: int, items: list[Item], last: bool) -> str:
        return F.encode_json(partition, items, last)


class BinaryEncoder(_Control):
    def items(self, partition: int, items: list[Item], last: bool) -> bytes:
        return F.encode_binary(partition, items, last)


_ENCODERS: dict[str, Encoder] = {"json": JsonEncoder(), "binary": BinaryEncoder()}


def encoder_for(codec: str) -> Encoder:
    return _ENCODERS[codec]
