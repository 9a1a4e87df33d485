"""Where a tailing consumer's latency goes, stage by stage, in one process.

    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_tail_stages                      # 2,500 writes/s, 10 s
    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_tail_stages --switch-interval 0.0005 --freeze

A real engine (64 partitions, default flush interval) and a real ``StreamServer`` with one
in-process consumer (``bench_passes.FakeWebSocket``: takes every message at once).  The writer
sends what is due every tick as one batch through ``EngineRunner.write`` (the writer thread, as
the bulk route does), like the peer suite's paced writer.  Per write (ms percentiles):

* ``hop``: ``await runner.write`` (event loop -> writer thread -> event loop);
* ``wake``: the writer thread's change mark -> the hub's callback on the loop (``CoalescedPartitions.delay``);
* ``send``: the hub's delivery -> the first frame carrying the change handed to the socket (the
  server's ``upr_stream_delivery_seconds``);
* ``total``: the batch's start -> the message carrying it handed to the socket;

the connection's passes by kind (shared, produced inline from memory, the rest with reader-thread
jobs: a position the flusher persisted past is read from disk),

and the cyclic GC's pauses in the process (``gc.callbacks``).  The HTTP request, the network and
the consumer's decoding are not in it: what is left of the suite's send->receipt is theirs.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from app.runner import EngineRunner
from app.stream.connection import StreamLimits
from app.stream.server import StreamServer
from app.streams_registry import StreamRegistry
from bench.bench_passes import PARTITIONS, FakeWebSocket
from engine.config import EngineConfig
from engine.core.types import Op, WriteOp
from engine.engine import Engine


class _Observed:
    def __init__(self) -> None:
        self.values: list[float] = []

    def labels(self, *_: Any) -> "_Observed":
        return self

    def inc(self, *_: Any) -> None:
        pass

    def observe(self, v: float) -> None:
        self.values.append(v)


class _Metrics:
    def __init__(self) -> None:
        self.delivery = _Observed()
        self.rollbacks = self.stream_bytes = self.cursor_drops = _Observed()


class _TimedSocket(FakeWebSocket):
    """Notes when each message is handed over and how many items were delivered by then."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.conn: Any = None
        self.sends: list[tuple[float, int]] = []

    def _sent(self, size: int) -> None:
        super()._sent(size)
        if self.conn is not None:
            self.sends.append((time.monotonic(), sum(self.conn.session.positions.values())))


def _pct(values: list[float], ps: tuple[float, ...] = (50, 90, 99, 99.9)) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)
    return {f"p{p:g}": 1e3 * v[min(len(v) - 1, int(len(v) * p / 100))] for p in ps}


async def run(rate: int, seconds: float, flush_interval_ms: float | None = None,
              gc_threshold: int | None = None) -> dict[str, Any]:
    pauses: list[tuple[int, float, float, int]] = []  # generation, wall s, CPU s, young objects
    started = [0.0, 0.0, 0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0], started[1], started[2] = time.perf_counter(), time.thread_time(), gc.get_count()[0]
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0], time.thread_time() - started[1],
                           started[2]))

    with tempfile.TemporaryDirectory() as tmp:
        extra: dict[str, Any] = {"flush_interval_ms": flush_interval_ms} if flush_interval_ms else {}
        if gc_threshold:
            gc.set_threshold(gc_threshold, *gc.get_threshold()[1:])
            extra["gc_young_threshold"] = gc_threshold
        engine = Engine.open(EngineConfig(data_dir=Path(tmp) / "data", partitions=PARTITIONS, **extra))
        runner = EngineRunner(engine)
        metrics = _Metrics()
        server = StreamServer(engine=engine, runner=runner, limits=StreamLimits(), streams=StreamRegistry(),
                              metrics=metrics, stream_metrics=metrics)
        wakes: list[float] = []
        hub = server.hub
        deliver = hub._deliver  # noqa: SLF001 - the bench times the hub's own callback

        def timed_deliver(dirty: frozenset[int]) -> None:
            wakes.append(hub._changes.delay)  # noqa: SLF001
            deliver(dirty)

        hub._changes._deliver = timed_deliver  # noqa: SLF001
        ws = _TimedSocket("tail")
        task = asyncio.create_task(server.serve(ws))
        await asyncio.sleep(0.5)
        ws.conn = next(iter(server.streams._handles.values()))  # noqa: SLF001
        metrics.delivery.values.clear()
        gc.callbacks.append(on_gc)
        total = int(rate * seconds)
        starts: list[tuple[float, int]] = []  # (batch start, items written before it ends)
        hops: list[float] = []
        t0 = time.monotonic()
        written = 0
        while written < total:
            now = time.monotonic()
            due = min(total, int((now - t0) * rate) + 1, written + 1000)
            if due <= written:
                await asyncio.sleep(max(0.0, t0 + written / rate - now))
                continue
            ops = [WriteOp(Op.MUTATION, f"doc:{i:010d}", b"x" * 200) for i in range(written, due)]
            await runner.write(engine.write_batch, ops)
            hops.append(time.monotonic() - now)
            written = due
            starts.append((now, written))
        deadline = time.monotonic() + 30
        while sum(ws.conn.session.positions.values()) < total and time.monotonic() < deadline:
            ws.ack_all()
            await asyncio.sleep(0.01)
        gc.callbacks.remove(on_gc)
        conn = ws.conn
        counts = {"passes": conn.session.cycle, "shared_passes": conn.shared_sent, "inline_passes": conn.inline_passes,
                  "reader_jobs": server.jobs.jobs, "reader_hops": server.jobs.hops}
        await server.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        runner.shutdown()
        engine.close()
    totals: list[float] = []
    j = 0
    sends = ws.sends
    prev = 0
    for start, upto in starts:
        while j < len(sends) and sends[j][1] < upto:
            j += 1
        if j == len(sends):
            break
        totals += [sends[j][0] - start] * (upto - prev)  # every item of the batch
        prev = upto
    return {"hop_ms": _pct(hops), "wake_ms": _pct(wakes), "send_ms": _pct(metrics.delivery.values),
            "total_ms": _pct(totals), "batches": len(starts), "messages": ws.messages, **counts,
            "gc_threshold": gc.get_threshold(), "gc": _gc_summary(pauses)}


def _gc_summary(pauses: list[tuple[int, float, float, int]]) -> dict[str, Any]:
    """Per generation: collections, their wall and CPU pause percentiles (ms), young objects."""
    out: dict[str, Any] = {}
    for g in (0, 1, 2):
        mine = [p for p in pauses if p[0] == g]
        if mine:
            out[f"gen{g}"] = {"count": len(mine), "wall_ms": _pct([p[1] for p in mine], (50, 99, 100)),
                              "cpu_ms": _pct([p[2] for p in mine], (50, 99, 100)),
                              "cpu_sum_ms": 1e3 * sum(p[2] for p in mine),
                              "young_max": max(p[3] for p in mine)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=2500)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for the run")
    ap.add_argument("--flush-interval-ms", type=float, default=None, help="the engine's (default: its own)")
    ap.add_argument("--gc-threshold", type=int, default=None,
                    help="the engine's gc_young_threshold (default: EngineConfig's)")
    ap.add_argument("--freeze", action="store_true", help="gc.freeze() before the run (start-up objects out of GC scans)")
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.freeze:
        gc.collect()
        gc.freeze()
    r = asyncio.run(run(args.rate, args.seconds, args.flush_interval_ms, args.gc_threshold))
    print(json.dumps({"switch_interval": sys.getswitchinterval(), "freeze": args.freeze,
                      "flush_interval_ms": args.flush_interval_ms, **r}))


if __name__ == "__main__":
    main()
