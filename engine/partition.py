"""One partition's in-memory state: lifecycle state, failover log, counters and write queue.

Plain data owned by the engine.  Fields change only under the engine's writer lock (state,
failover log, queue contents, live count) or the flusher (persisted counters it owns); readers
take single attribute reads, which are atomic under the GIL.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.failover import FailoverLog
from engine.core.replica_snapshots import ReplicaSnapshots
from engine.core.types import PartitionState, PartitionStats
from engine.writequeue import WriteQueue


@dataclass(slots=True, eq=False)
class Partition:
    id: int
    state: PartitionState
    failover_log: FailoverLog
    purge_seqno: int
    #: live (non-deleted) keys including queued writes, maintained by the writer.
    live_items: int
    #: live keys as persisted, maintained by the flusher (stored with the persisted seqno).
    persisted_live: int
    #: highest CAS persisted, so CAS keeps increasing across restarts even if the clock steps back.
    persisted_max_cas: int = 0
    queue: WriteQueue = field(default_factory=lambda: WriteQueue(0))
    #: the snapshots a replica copy holds whole (``engine.core.replica_snapshots``); replaced, never mutated
    snapshots: ReplicaSnapshots = field(default_factory=ReplicaSnapshots)
    #: bumped when the partition is emptied (``Engine.reset_partition``), so a flush round that
    #: read the old queue before the reset writes nothing of it after
    generation: int = 0
    #: an active copy being handed to a replica (``Engine.stop_writes``): it keeps its state, so
    #: streams go on sending what it holds, but takes no write until the handover ends
    writes_stopped: bool = False

    @property
    def high_seqno(self) -> int:
        return self.queue.root.high

    @property
    def persisted_seqno(self) -> int:
        return self.queue.persisted

    def stats(self) -> PartitionStats:
        queue = self.queue
        return PartitionStats(
            partition=self.id,
            state=self.state,
            high_seqno=queue.root.high,
            persisted_seqno=queue.persisted,
            purge_seqno=self.purge_seqno,
            item_count=self.live_items,
            queue_depth=queue.depth,
            queue_bytes=queue.bytes,
            failover_log=self.failover_log,
        )
