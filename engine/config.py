"""Engine configuration: explicit, typed limits with the defaults documented here."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class EngineConfig:
    data_dir: Path = Path("./data")
    #: Used only when the data dir is created; afterwards the stored count wins.
    partitions: int = 64
    #: How often the flusher persists ``memory`` writes; ``persist`` writes kick it at once.
    flush_interval_ms: float = 5.0
    max_key_bytes: int = 250
    max_value_bytes: int = 20 * MiB
    #: Failover log entries kept per partition (DCP's max_failover_entries).
    failover_log_cap: int = 25
    #: Writes get ``Backpressure`` while the write queues hold more than this.
    queue_memory_limit_bytes: int = 1024 * MiB
    #: Initial LMDB map size; grown (doubled) on MapFullError.  Large by default because it is
    #: only address space (the file grows as data is written), and growing must wait until no
    #: read transaction is open, which a slow stream's disk snapshot can delay.
    lmdb_map_size: int = 16 << 30
    #: While flushing fails (a full disk), writes get ``Backpressure`` once the write queues hold
    #: more than this: a stop then loses at most this much, and memory does not fill up instead.
    flush_failure_backlog_bytes: int = 64 * MiB
    #: Longest wait between two attempts of a failing flush (the wait doubles from 50 ms up to it);
    #: also about how long the engine takes to notice that space has returned.
    flush_retry_max_s: float = 2.0
    #: Largest number of items one flush moves in one LMDB write transaction.
    flush_batch_items: int = 50_000
    #: The cyclic GC's thresholds, applied process-wide at ``Engine.open``
    #: (``engine.core.gc_policy``): generation-0 collections every ``gc_young_threshold``
    #: allocations, generation 1 every ``gc_middle_threshold`` of those, a full collection at
    #: most every ``gc_full_interval_s`` (None: CPython's own rule).  ``gc_young_threshold``
    #: None leaves the GC alone.
    gc_young_threshold: int | None = 2_000
    gc_middle_threshold: int = 2
    gc_full_interval_s: float | None = 120.0
