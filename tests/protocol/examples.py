"""One example per message type, shared by the codec and AsyncAPI tests."""
from __future__ import annotations

from engine.protocol.messages import (
    Ack,
    Barrier,
    BarrierReachedMessage,
    CloseStream,
    Codec,
    CycleComplete,
    Error,
    FailoverLogs,
    Hello,
    PartitionInfo,
    SeqnoAck,
    SnapshotMarker,
    SnapshotSource,
    StreamEndMessage,
    StreamEndReason,
    StreamRequest,
    StreamResponse,
    StreamStatus,
    Visibility,
)
from engine.core.types import FailoverEntry

LOG = (FailoverEntry(0xBEEF, 80), FailoverEntry(0xCAFE, 0))

CLIENT_EXAMPLES = [
    Hello("indexer:1", partitions=(0, 3, 7), codec=Codec.BINARY, window_bytes=1 << 20),
    Hello("search-index", visibility=Visibility.PERSISTED),
    Hello("all-defaults"),
    StreamRequest(3, uuid=0xBEEF, start_seqno=90, snap_start=85, snap_end=95, end_seqno=200),
    StreamRequest(0, uuid=0, start_seqno=0, snap_start=0, snap_end=0, to_now=True, strict_uuid=True),
    CloseStream(3),
    Barrier("cut-1"),
    Ack(65536),
    SeqnoAck(3, received=120, persisted=100),
]

SERVER_EXAMPLES = [
    FailoverLogs("node-a", 64, {3: PartitionInfo("active", 120, 10, LOG), 7: PartitionInfo("replica", 0, 0, ())}),
    StreamResponse(3, StreamStatus.OK, detail="same history", failover_log=LOG, end_seqno=None),
    StreamResponse(3, StreamStatus.ROLLBACK, rollback_seqno=80, reason="diverged", detail="x", failover_log=LOG),
    StreamResponse(4, StreamStatus.RANGE_ERROR, detail="snap_start 9 > start_seqno 5", field="snap_start"),
    StreamResponse(5, StreamStatus.NOT_MY_PARTITION, detail="replica"),
    SnapshotMarker(3, 91, 120, SnapshotSource.DISK, 10),
    CycleComplete(1),
    BarrierReachedMessage("cut-1", {3: 120, 7: 0}),
    StreamEndMessage(3, StreamEndReason.END_SEQNO_REACHED, 200),
    Error("invalid_field", "hello.name: too long", "name", None),
    Error("duplicate_stream", "already open", "partition", 3),
]
