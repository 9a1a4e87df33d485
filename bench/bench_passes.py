"""The stream server's cost per delivered item under fan-out, in one process, shared passes on and off.

    .venv/bin/python -m bench.bench_passes                    # 50 connections, 1,000 writes/s, 5 s, both modes
    .venv/bin/python -m bench.bench_passes --connections 200 --seconds 5

A real engine (64 partitions, default flush interval) and a real ``StreamServer``; the WebSockets
are in-process stand-ins that take every message at once and acknowledge the window, so the
figure is the server's own work (event loop, writer and reader threads: ``time.process_time`` of
the whole process), not the machine's scheduling of consumer processes, which on a busy shared
machine dominates the peer suite's wall-clock figures.  The writer writes one document per
request, ``--rate`` a second, through ``EngineRunner.write`` (the writer thread, as the HTTP route
does), so nearly every write is its own snapshot.  Printed per mode: CPU µs per delivered item
(delivered = the streams' positions: one document per seqno), WebSocket messages per delivered
item, passes, shared passes, and the rate the writer achieved.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from app.runner import EngineRunner
from app.stream.connection import StreamLimits
from app.stream.server import StreamServer
from app.streams_registry import StreamRegistry
from engine.config import EngineConfig
from engine.core.types import Op, WriteOp
from engine.engine import Engine

PARTITIONS = 64


class _Counter:
    def labels(self, *_: Any) -> "_Counter":
        return self

    def inc(self, *_: Any) -> None:
        pass

    def observe(self, *_: Any) -> None:
        pass


class _Metrics:
    rollbacks = stream_bytes = delivery = cursor_drops = _Counter()


class FakeWebSocket:
    """Takes every message at once (counted, not decoded); acknowledges every MiB."""

    def __init__(self, name: str) -> None:
        self.client = None
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._unacked = 0
        self.messages = 0
        hello = {"type": "hello", "name": name, "codec": "binary", "window_bytes": 16 << 20, "protocol": 1,
                 "bundle": True}
        self.put(hello)
        for p in range(PARTITIONS):
            self.put({"type": "stream_request", "partition": p, "uuid": 0, "start_seqno": 0, "snap_start": 0,
                      "snap_end": 0})

    def put(self, obj: dict[str, Any]) -> None:
        self._inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(obj)})

    async def accept(self) -> None:
        pass

    async def receive(self) -> dict[str, Any]:
        return await self._inbox.get()

    async def send_text(self, data: str) -> None:
        self._sent(len(data))

    async def send_bytes(self, data: bytes) -> None:
        self._sent(len(data))

    def _sent(self, size: int) -> None:
        self.messages += 1
        self._unacked += size
        if self._unacked >= 1 << 20:
            self.put({"type": "ack", "bytes": self._unacked})
            self._unacked = 0

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self._inbox.put_nowait({"type": "websocket.disconnect"})

    def ack_all(self) -> None:
        if self._unacked:
            self.put({"type": "ack", "bytes": self._unacked})
            self._unacked = 0


async def run(connections: int, rate: int, seconds: float, shared: bool, paced: bool = True) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine.open(EngineConfig(data_dir=Path(tmp) / "data", partitions=PARTITIONS))
        runner = EngineRunner(engine)
        limits = StreamLimits() if shared else StreamLimits(shared_passes=False)
        server = StreamServer(engine=engine, runner=runner, limits=limits,
                              streams=StreamRegistry(), metrics=_Metrics(), stream_metrics=_Metrics())
        if not paced:
            server.hub.pacer.gather_s = 0  # every change wakes the streams at once
        sockets = [FakeWebSocket(f"c{i}") for i in range(connections)]
        tasks = [asyncio.create_task(server.serve(ws)) for ws in sockets]
        await asyncio.sleep(0.5)  # hellos and stream requests answered
        total = int(rate * seconds)
        cpu0, t0 = time.process_time(), time.monotonic()
        for i in range(total):
            due = t0 + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await runner.write(engine.write_batch, [WriteOp(Op.MUTATION, f"doc:{i:010d}", b"x" * 200)])
        write_wall = time.monotonic() - t0
        conns = list(server.streams._handles.values())  # noqa: SLF001 - a bench reads the counters
        deadline = time.monotonic() + 60
        while _delivered(conns) < total * connections and time.monotonic() < deadline:
            for ws in sockets:
                ws.ack_all()
            await asyncio.sleep(0.01)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        delivered = _delivered(conns)
        messages = sum(ws.messages for ws in sockets)
        passes = sum(c.session.cycle for c in conns)
        shared_passes = sum(getattr(c, "shared_sent", 0) for c in conns)
        held = server.hub.pacer.held_deliveries
        await server.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        runner.shutdown()
        engine.close()
    return {"delivered": delivered, "expected": total * connections, "cpu_s": cpu, "wall_s": wall,
            "us_per_item": 1e6 * cpu / max(1, delivered), "messages_per_item": messages / max(1, delivered),
            "passes": passes, "shared_passes": shared_passes, "write_rate": total / write_wall,
            "held_deliveries": held}


def _delivered(conns: list[Any]) -> int:
    """Items sent so far: every stream's position (one document per seqno, none rewritten)."""
    return sum(sum(c.session.positions.values()) for c in conns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--modes", default="usual,shared",
                    help="comma-separated: usual (shared passes off), shared, unpaced (shared, wake-up pacing off)")
    args = ap.parse_args()
    for mode in args.modes.split(","):
        r = asyncio.run(run(args.connections, args.rate, args.seconds, mode != "usual", paced=mode != "unpaced"))
        print(f"{mode:6} {args.connections} connections x {args.rate}/s for {args.seconds:g}s: "
              f"delivered {r['delivered']:,.0f}/{r['expected']:,.0f}, server CPU {r['cpu_s']:.2f}s "
              f"in {r['wall_s']:.1f}s = {r['us_per_item']:.2f} us per delivered item, "
              f"{r['messages_per_item']:.3f} messages per item, {r['passes']:,} passes "
              f"({r['shared_passes']:,} shared, {r['held_deliveries']:,} deliveries paced); "
              f"writer achieved {r['write_rate']:,.0f}/s", flush=True)


if __name__ == "__main__":
    main()
