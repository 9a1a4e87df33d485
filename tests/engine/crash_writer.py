"""A writer process for the crash tests (run by test_crash.py, then SIGKILLed).

Usage: python crash_writer.py DATA_DIR load        -- write forever; print one JSON line per
                                                    acknowledged ``persist`` write
       python crash_writer.py DATA_DIR branch      -- leave an unpersisted branch, kill itself
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
from pathlib import Path

from engine.config import EngineConfig
from engine.engine import Engine
from engine.core.types import Op, PartitionState, WriteOp


def emit(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def load(engine: Engine) -> None:
    rng = random.Random(7)
    n = 0
    while True:
        # memory-only traffic: rewrites and deletes of a hot set (never acknowledged as persisted)
        hot = [WriteOp(Op.MUTATION, f"hot-{rng.randrange(200)}", os.urandom(rng.randrange(1, 300)))
               for _ in range(50)]
        hot += [WriteOp(Op.DELETION, f"hot-{rng.randrange(200)}") for _ in range(5)]
        engine.write_batch(hot)
        batch = [WriteOp(Op.MUTATION, f"ack-{n + i}", b"value-%d" % (n + i)) for i in range(25)]
        results = engine.write_batch(batch)
        targets: dict[int, int] = {}
        for r in results:
            targets[r.partition] = max(targets.get(r.partition, 0), r.seqno)
        engine.persist_future(targets).result()
        for r in results:
            emit(type="ack", key=r.key, partition=r.partition, seqno=r.seqno, value=f"value-{r.key[4:]}")
        n += len(batch)


def branch(engine: Engine) -> None:
    """Persist 10 items in partition 0, queue 5 more, become active again (failover entry at
    the unpersisted high seqno 15), then die: the restart must prune that entry."""
    engine.write_batch([WriteOp(Op.MUTATION, f"p-{i}", b"x") for i in range(10)])
    engine.flush_now()
    engine.write_batch([WriteOp(Op.MUTATION, f"q-{i}", b"y") for i in range(5)])
    engine.set_state(0, PartitionState.REPLICA)
    engine.set_state(0, PartitionState.ACTIVE)
    emit(type="log", log=[[e.uuid, e.seqno] for e in engine.failover_log(0)])
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    data_dir, mode = Path(sys.argv[1]), sys.argv[2]
    partitions = 8 if mode == "load" else 1
    interval = 20.0 if mode == "load" else 60_000.0
    engine = Engine.open(EngineConfig(data_dir=data_dir, partitions=partitions, flush_interval_ms=interval))
    emit(type="start", logs={p: [[e.uuid, e.seqno] for e in engine.failover_log(p)] for p in range(partitions)})
    (load if mode == "load" else branch)(engine)


if __name__ == "__main__":
    main()
