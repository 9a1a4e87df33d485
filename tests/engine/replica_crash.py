"""A replica process for test_replica.py: applies one whole snapshot and half of the next, makes
sure both are on disk, then SIGKILLs itself (a crash in the middle of a replicated snapshot).

Usage: python replica_crash.py DATA_DIR
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from engine.config import EngineConfig
from engine.core.types import FailoverEntry, Item, PartitionState
from engine.engine import Engine


def main(data_dir: Path) -> None:
    engine = Engine.open(EngineConfig(data_dir=data_dir, partitions=4, flush_interval_ms=2.0))
    engine.set_state(0, PartitionState.REPLICA)
    engine.adopt_failover_log(0, [FailoverEntry(77, 0)])
    engine.replica_marker(0, 1, 10)
    engine.apply_replicated(0, [Item(b"k%d" % s, s, 1000 + s, 1, False, b"v") for s in (2, 5, 9)], last=True)
    engine.replica_marker(0, 11, 20)
    engine.apply_replicated(0, [Item(b"k%d" % s, s, 1000 + s, 1, False, b"v") for s in (12, 14)], last=False)
    engine.flush_now()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
