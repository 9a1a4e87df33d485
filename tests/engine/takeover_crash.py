"""A handover target for test_replica.py: takes partition 0 over in memory only (its stored state
staged, not committed), takes one write as active, then SIGKILLs itself, either before any flush
(``before-flush``: the flusher's interval is a minute) or once the write is persisted
(``after-flush``).

Usage: python takeover_crash.py DATA_DIR before-flush|after-flush
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from engine.config import EngineConfig
from engine.core.types import FailoverEntry, Item, Op, PartitionState, WriteOp
from engine.engine import Engine


def main(data_dir: Path, when: str) -> None:
    engine = Engine.open(EngineConfig(data_dir=data_dir, partitions=4, flush_interval_ms=60_000.0))
    engine.set_state(0, PartitionState.REPLICA)
    engine.adopt_failover_log(0, [FailoverEntry(77, 0)])
    engine.replica_marker(0, 1, 6)
    engine.apply_replicated(0, [Item(b"k%d" % s, s, 1000 + s, 1, False, b"v") for s in (2, 6)], last=True)
    engine.flush_now()
    engine.take_over(0, commit=False)
    key = next(f"new-{i}" for i in range(1000) if engine.partition_of(f"new-{i}") == 0)
    result = engine.write(WriteOp(Op.MUTATION, key, b"taken as active"))
    if when == "after-flush":
        engine.persist_future({0: result.seqno}).result()
    print(key, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
