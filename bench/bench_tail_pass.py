"""The event loop's CPU for one tail consumer's pass over a bulk request's writes, in one process.

    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_tail_pass                 # batches of 190, 300 batches
    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_tail_pass --batch 20 --profile

The peer suite's tail writer is closed-loop: at 2,500/s on this machine each bulk request holds
100-200 documents spread over most of the 64 partitions, and the lone consumer's pass (carried
out on the hub's delivery) visits every partition touched.  Here a real engine and
``StreamServer`` with one in-process connection (``bench.bench_passes``' stand-ins, frames to a
stand-in transport as behind uvicorn) get one batch at a time through the writer thread, and the
next batch waits until the connection has sent it all, so the loop thread's CPU per batch
(``time.thread_time``) is the pass's own cost whatever the machine's load.  Printed: loop CPU µs
per batch, per partition visit and per document; messages per batch.  ``--profile``: cProfile of
the loop thread (top functions by own time).
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_passes import PARTITIONS, FakeWebSocket
from engine.core.types import Op, WriteOp
from tests.support.raw_transport import InProcessStreams


async def run(batch: int, batches: int, profile: cProfile.Profile | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        streams = InProcessStreams(Path(tmp) / "data", PARTITIONS)
        engine, runner, server = streams.engine, streams.runner, streams.server
        ws = FakeWebSocket("tail")
        streams.serve([ws])
        await asyncio.sleep(0.5)  # hello and stream requests answered
        (conn,) = list(server.streams._handles.values())  # noqa: SLF001 - a bench reads the counters
        session = conn.session
        messages0, visits, n = ws.messages, 0, 0
        loop_cpu = 0.0
        for b in range(batches):
            ops = [WriteOp(Op.MUTATION, f"doc:{n + i:010d}", b'{"v":' + b"1" * 190 + b"}") for i in range(batch)]
            n += batch
            t0 = time.thread_time()  # the write's hop and the hub's delivery run on the loop meanwhile
            if profile is not None:
                profile.enable()
            results = await runner.write(engine.write_batch, ops)
            last: dict[int, int] = {}
            for r in results:
                last[r.partition] = max(last.get(r.partition, 0), r.seqno)
            visits += len(last)
            while any(session.positions.get(p, 0) < s for p, s in last.items()):
                await asyncio.sleep(0)
            if profile is not None:
                profile.disable()
            loop_cpu += time.thread_time() - t0
            ws.ack_all()
        messages = ws.messages - messages0
        await streams.close()
    return {"batch": batch, "batches": batches, "loop_us_per_batch": 1e6 * loop_cpu / batches,
            "loop_us_per_visit": 1e6 * loop_cpu / max(1, visits), "loop_us_per_doc": 1e6 * loop_cpu / n,
            "visits_per_batch": visits / batches, "messages_per_batch": messages / batches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=190)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    prof = cProfile.Profile() if args.profile else None
    print(json.dumps(asyncio.run(run(args.batch, args.batches, prof))))
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
