"""The stream server's cost per delivered item under fan-out, in one process, shared passes on and off.

    .venv/bin/python -m bench.bench_passes                    # 50 connections, 1,000 writes/s, 5 s, both modes
    .venv/bin/python -m bench.bench_passes --connections 200 --seconds 5
    .venv/bin/python -m bench.bench_passes --lockstep 2000    # one pass per connection per write
    .venv/bin/python -m bench.bench_passes --lockstep 200 --batch 100 --modes usual,shared

A real engine (64 partitions, default flush interval) and a real ``StreamServer``; the WebSockets
are in-process stand-ins that take every message at once and acknowledge the window, so the
figure is the server's own work (event loop, writer and reader threads: ``time.process_time`` of
the whole process), not the machine's scheduling of consumer processes, which on a busy shared
machine dominates the peer suite's wall-clock figures.  The writer writes one document per
request, ``--rate`` a second, from a thread of its own (``Engine.write_batch``, as the writer thread of the HTTP
route calls it), each when due, so nearly every write is its own snapshot.  Printed per mode: CPU µs per delivered item
(delivered = the streams' positions: one document per seqno), WebSocket messages per delivered
item, passes, shared passes (and of those, carried out on the hub's delivery), sender task wake-ups
per delivered item, and the rate the writer achieved.  Frames go to a stand-in transport as a
real uvicorn's would (``app.stream.rawframes``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from app.stream.connection import StreamLimits
from engine.core.types import Op, WriteOp
from tests.support.raw_transport import InProcessStreams, raw_scope

PARTITIONS = 64


class FakeWebSocket:
    """Takes every message at once (counted, not decoded); acknowledges every MiB.  With ``raw``
    its scope offers the direct transport writes a real uvicorn offers (``app.stream.rawframes``)."""

    def __init__(self, name: str, raw: bool = True, frames: str = "messages") -> None:
        self.client = None
        self.scope = raw_scope(self._frame) if raw else {}
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._unacked = 0
        self.messages = 0
        hello = {"type": "hello", "name": name, "codec": "binary", "window_bytes": 16 << 20, "protocol": 1,
                 "bundle": True, "frames": frames}
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

    def _frame(self, parts: Any) -> None:
        parts = tuple(parts)
        self._sent(sum(map(len, parts[1:])))  # the first part is the frame header

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
        limits = StreamLimits() if shared else StreamLimits(shared_passes=False)
        streams = InProcessStreams(Path(tmp) / "data", PARTITIONS, limits)
        engine, server = streams.engine, streams.server
        if not paced:
            server.hub.pacer.gather_s = 0  # every change wakes the streams at once
        sockets = [FakeWebSocket(f"c{i}") for i in range(connections)]
        streams.serve(sockets)
        await asyncio.sleep(0.5)  # hellos and stream requests answered
        total = int(rate * seconds)
        cpu0, loop0, t0 = time.process_time(), time.thread_time(), time.monotonic()
        # the writes come from a thread of their own at their rate, as the peer suite's writer
        # process sends whatever the server's loop is doing: the offered rate does not fall with
        # the loop's latency, and the loop sees only the engine's change notifications
        def write_all() -> None:
            for i in range(total):
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                engine.write_batch([WriteOp(Op.MUTATION, f"doc:{i:010d}", b"x" * 200)])

        await asyncio.get_running_loop().run_in_executor(None, write_all)
        write_wall = time.monotonic() - t0
        conns = list(server.streams._handles.values())  # noqa: SLF001 - a bench reads the counters
        deadline = time.monotonic() + 60
        while _delivered(conns) < total * connections and time.monotonic() < deadline:
            for ws in sockets:
                ws.ack_all()
            await asyncio.sleep(0.01)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        loop_cpu = time.thread_time() - loop0  # the event loop's thread alone: the streams' side
        delivered = _delivered(conns)
        messages = sum(ws.messages for ws in sockets)
        passes = sum(c.session.cycle for c in conns)
        shared_passes = sum(getattr(c, "shared_sent", 0) for c in conns)
        direct = sum(getattr(c, "direct_passes", 0) for c in conns)
        wakeups = sum(getattr(c, "sender_wakeups", 0) for c in conns)
        held = server.hub.pacer.held_deliveries
        await streams.close()
    return {"delivered": delivered, "expected": total * connections, "cpu_s": cpu, "wall_s": wall,
            "us_per_item": 1e6 * cpu / max(1, delivered),
            "loop_us_per_item": 1e6 * loop_cpu / max(1, delivered), "messages_per_item": messages / max(1, delivered),
            "passes": passes, "shared_passes": shared_passes, "write_rate": total / write_wall,
            "held_deliveries": held, "direct_passes": direct, "wakeups_per_item": wakeups / max(1, delivered)}


async def run_lockstep(connections: int, writes: int, batch: int = 1, shared: bool = True,
                       frames: str = "messages") -> dict[str, float]:
    """Each write is delivered to every connection before the next is made: one pass and one
    message per connection per write whatever the machine's load, so the event loop thread's CPU
    per delivery is the cost of one connection's tail pass (plus the write's share of the hub),
    comparable between trees on a loaded machine.  ``batch`` documents per write (spread over
    the partitions by their keys): with ~100, each pass visits most partitions for one or two
    items each, as a consumer ~0.1 s behind a 1,000/s writer does in the peer suite.
    ``shared`` False: shared passes off, each connection produces its own visits.  ``frames``:
    what the connections' hellos ask for (``packed``: packed passes)."""
    with tempfile.TemporaryDirectory() as tmp:
        limits = StreamLimits() if shared else StreamLimits(shared_passes=False)
        streams = InProcessStreams(Path(tmp) / "data", PARTITIONS, limits)
        engine, runner, server = streams.engine, streams.runner, streams.server
        server.hub.pacer.gather_s = 0  # one write at a time: a held delivery would only be waited for
        sockets = [FakeWebSocket(f"c{i}", frames=frames) for i in range(connections)]
        streams.serve(sockets)
        await asyncio.sleep(0.5)  # hellos and stream requests answered
        conns = list(server.streams._handles.values())  # noqa: SLF001 - a bench reads the counters
        sessions = [c.session for c in conns]
        messages0 = sum(ws.messages for ws in sockets)
        wakeups0 = sum(getattr(c, "sender_wakeups", 0) for c in conns)
        loop0 = time.thread_time()
        visits0 = sum(sum(st.visits for st in s.streams.values()) for s in sessions)
        for i in range(writes):
            ops = [WriteOp(Op.MUTATION, f"doc:{i * batch + j:010d}", b"x" * 200) for j in range(batch)]
            results = await runner.write(engine.write_batch, ops)
            highs: dict[int, int] = {}
            for res in results:
                highs[res.partition] = max(highs.get(res.partition, 0), res.seqno)
            while any(s.positions.get(p, 0) < seqno for s in sessions for p, seqno in highs.items()):
                await asyncio.sleep(0 if batch == 1 else 0.001)  # the check itself is loop time
            if i % 64 == 63 or batch > 1:
                for ws in sockets:
                    ws.ack_all()
        loop_cpu = time.thread_time() - loop0
        delivered = writes * batch * connections
        visits = sum(sum(st.visits for st in s.streams.values()) for s in sessions) - visits0
        visits_now = sum(getattr(c, "visits_now", 0) for c in conns)
        messages = sum(ws.messages for ws in sockets) - messages0
        wakeups = sum(getattr(c, "sender_wakeups", 0) for c in conns) - wakeups0
        direct = sum(getattr(c, "direct_passes", 0) for c in conns)
        packed = sum(getattr(c, "packed_passes", 0) for c in conns)
        await streams.close()
    return {"loop_us_per_item": 1e6 * loop_cpu / delivered, "messages_per_item": messages / delivered,
            "wakeups_per_item": wakeups / delivered, "direct_passes": direct, "packed_passes": packed, "delivered": delivered,
            "visits_per_item": visits / delivered, "visits_now": visits_now / max(1, visits)}


def _delivered(conns: list[Any]) -> int:
    """Items sent so far: every stream's position (one document per seqno, none rewritten)."""
    return sum(sum(c.session.positions.values()) for c in conns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--modes", default=None,
                    help="comma-separated: usual (shared passes off), shared, unpaced (shared, wake-up pacing off), "
                         "packed (with --lockstep: shared, the consumers ask for packed passes); "
                         "default usual,shared (with --lockstep: shared)")
    ap.add_argument("--lockstep", type=int, default=0, metavar="WRITES",
                    help="instead: WRITES writes, each delivered to every connection before the next")
    ap.add_argument("--batch", type=int, default=1, metavar="DOCS",
                    help="with --lockstep: documents per write (100: passes of one or two items per partition)")
    args = ap.parse_args()
    if args.lockstep:
        for mode in (args.modes or "shared").split(","):
            r = asyncio.run(run_lockstep(args.connections, args.lockstep, args.batch, mode in ("shared", "packed"),
                                         "packed" if mode == "packed" else "messages"))
            print(f"lockstep {mode:6} {args.connections} connections x {args.lockstep} writes of {args.batch}: "
                  f"delivered {r['delivered']:,}, event loop thread {r['loop_us_per_item']:.2f} us per delivered "
                  f"item, {r['messages_per_item']:.3f} messages, {r['visits_per_item']:.3f} visits and "
                  f"{r['wakeups_per_item']:.3f} sender wake-ups per item, {r['visits_now']:.0%} of visits "
                  f"without suspending, {r['direct_passes']:,} passes on the hub's delivery, {r['packed_passes']:,} "
                  f"packed", flush=True)
        return
    for mode in (args.modes or "usual,shared").split(","):
        r = asyncio.run(run(args.connections, args.rate, args.seconds, mode != "usual", paced=mode != "unpaced"))
        print(f"{mode:6} {args.connections} connections x {args.rate}/s for {args.seconds:g}s: "
              f"delivered {r['delivered']:,.0f}/{r['expected']:,.0f}, server CPU {r['cpu_s']:.2f}s "
              f"in {r['wall_s']:.1f}s = {r['us_per_item']:.2f} us per delivered item "
              f"(event loop thread {r['loop_us_per_item']:.2f}), "
              f"{r['messages_per_item']:.3f} messages per item, {r['passes']:,} passes "
              f"({r['shared_passes']:,} shared, {r['direct_passes']:,} on the hub's delivery, "
              f"{r['held_deliveries']:,} deliveries paced), {r['wakeups_per_item']:.3f} sender wake-ups per item; "
              f"writer achieved {r['write_rate']:,.0f}/s", flush=True)


if __name__ == "__main__":
    main()
