"""A replica observer process for ``bench.bench_cluster``'s replication lag (``python -m bench.cluster_poll``).

Two ways to see when a replica holds a write, both in a process of its own (so that the
writer's event loop does not delay it), both giving the high seqnos of the partitions each node
holds as a replica, as ``Poll`` records:

* ``--observe stream`` (default): one stream connection per node, the ordinary stream protocol
  on the node's *replica* partitions (``expected_state: replica``) from their high seqnos: the
  node pushes each batch as its replica copy takes it, and each WebSocket message received is a
  record (sent = received = its arrival).  WHY: polling costs the observed node a full
  ``GET /partitions`` (a thread hop, every partition's stats, a 64-entry JSON answer) every
  poll period whether anything changed or not; a tail costs it one pass per change, and sees
  the change without waiting for the next poll.
* ``--observe poll``: ``GET /partitions`` (one request in flight per node, a pause of
  ``--interval-ms`` between two).  It says ``ready``,
is released with a window (``bench.cluster_procs.release_together``), polls from the window's
start until a ``stop`` line on stdin (the benchmark sends it once the replicas hold every
acknowledged write, or gives up) or ``--max-seconds`` past the window's end.  Only polls that
show a change are printed (the first poll covering a seqno always shows one, so the lags
computed from them are the same), with the count and median period of all polls: the method's
resolution.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from typing import Any

import orjson
from websockets.asyncio.client import connect

from bench.bench_http import RawConnection
from bench.cluster_procs import wait_for_start
from engine.core.types import PartitionState
from engine.protocol import messages as M
from engine.protocol.bundle import decode_bundle, is_bundle
from engine.protocol.frames import decode_binary

#: flow control: acknowledge what was read once this much is pending (the window is larger)
ACK_BYTES = 64 * 1024

#: after the stop line, how long an observer still waits for the seqnos it names
STOP_GRACE_S = 5.0


class Stop:
    """The benchmark's stop line, read on a thread: ``stop`` alone ends every observation at once;
    ``stop {json}`` names, per node URL, the high seqno of each partition its replica holds, and
    an observation of that node goes on until it has seen them all or ``grace_s`` passed.

    WHY: the benchmark stops the observer as soon as ``GET /partitions`` shows every replica
    holding every acknowledged write.  A replica that caught up just then (a stall ended) has
    applied its last writes a moment before, and the stream that carries them to the observer
    is a few milliseconds behind: stopping at once counted them as never seen, a bench
    artefact that looked like writes missing from a replica."""

    def __init__(self, grace_s: float = STOP_GRACE_S) -> None:
        self.grace_s = grace_s
        self._event = threading.Event()
        self._at = 0.0
        self._wanted: dict[str, dict[int, int]] = {}

    def set(self, line: str = "stop") -> None:
        """Take a stop line (or EOF: ``stop`` alone)."""
        rest = line.strip().removeprefix("stop").strip()
        if rest:
            self._wanted = {url: {int(p): int(s) for p, s in highs.items()}
                            for url, highs in orjson.loads(rest).items()}
        self._at = time.monotonic()
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def done(self, key: str, highs: dict[int, int], now: float) -> bool:
        """Whether the observation ``key`` (a node URL) should end now, having seen ``highs``."""
        if not self._event.is_set():
            return False
        wanted = self._wanted.get(key)
        if not wanted or now >= self._at + self.grace_s:
            return True
        return all(highs.get(p, 0) >= s for p, s in wanted.items())



async def poll_node(url: str, start_at: float, stopped: Stop, deadline: float,
                    interval: float) -> dict[str, Any]:
    conn = await RawConnection.open(url)
    changed: list[tuple[float, float, dict[int, int]]] = []
    received: list[float] = []
    last: dict[int, int] | None = None
    try:
        while time.monotonic() < start_at:
            await asyncio.sleep(0.001)
        while not stopped.done(url, last or {}, time.monotonic()):
            sent = time.monotonic()
            if sent >= deadline:
                break
            if received and sent < received[-1] + interval:
                await asyncio.sleep(received[-1] + interval - sent)
                sent = time.monotonic()
            status, body = await conn.request("GET", "/partitions")
            done = time.monotonic()
            if status != 200:
                raise RuntimeError(f"GET {url}/partitions answered {status}: {body[:200]!r}")
            highs = {p["partition"]: p["high_seqno"] for p in orjson.loads(body)["partitions"]
                     if p["state"] == "replica"}
            received.append(done)
            if highs != last:
                changed.append((sent, done, highs))
                last = highs
    finally:
        conn.close()
    gaps = [b - a for a, b in zip(received, received[1:])]
    return {"polls": changed, "count": len(received), "period": statistics.median(gaps) if gaps else None,
            "method": "poll"}


async def watch_node(url: str, start_at: float, stopped: Stop, deadline: float,
                     state: PartitionState = PartitionState.REPLICA, key: str | None = None) -> dict[str, Any]:
    """Tail the node's replica partitions (``state``: or its active ones) from their high
    seqnos; a record per message that moved a high seqno."""
    ws_url = "ws" + url.removeprefix("http") + "/stream"
    changed: list[tuple[float, float, dict[int, int]]] = []
    received: list[float] = []
    async with connect(ws_url, max_size=64 << 20, ping_interval=None) as ws:
        await ws.send(M.encode(M.Hello(name="lag-observer", codec=M.Codec.BINARY, bundle=True)))
        logs = M.decode_server_message(await ws.recv())
        if not isinstance(logs, M.FailoverLogs):
            raise RuntimeError(f"{url}: hello answered with {logs!r}")
        highs = {p: info.high_seqno for p, info in logs.partitions.items()
                 if info.state is state and info.log}
        for p, info in logs.partitions.items():
            if p in highs:
                await ws.send(M.encode(M.StreamRequest(p, info.log[0].uuid, info.high_seqno, info.high_seqno,
                                                       info.high_seqno, expected_state=state)))
        pending = 0
        started = False
        while not stopped.done(key or url, highs, time.monotonic()) and time.monotonic() < deadline:
            if not started and time.monotonic() >= start_at:  # what is held when the window opens
                started = True
                changed.append((time.monotonic(), time.monotonic(), dict(highs)))
            try:
                frame = await asyncio.wait_for(ws.recv(), 0.2)
            except asyncio.TimeoutError:
                continue
            at = time.monotonic()
            if at >= start_at:
                received.append(at)
            moved = False
            parts = decode_bundle(frame) if isinstance(frame, bytes) and is_bundle(frame) else [frame]
            for part in parts:
                if isinstance(part, bytes):
                    batch = decode_binary(part)
                    if len(batch) and batch.seqnos[-1] > highs.get(batch.partition, 0):
                        highs[batch.partition] = batch.seqnos[-1]
                        moved = True
                else:
                    msg = M.decode_server_message(part)
                    if isinstance(msg, M.StreamResponse) and msg.status is not M.StreamStatus.OK:
                        raise RuntimeError(f"{url}: partition {msg.partition} refused: {msg}")
            if moved and at >= start_at:
                changed.append((at, at, dict(highs)))
            pending += len(frame)
            if pending >= ACK_BYTES:
                await ws.send(M.encode(M.Ack(pending)))
                pending = 0
    gaps = [b - a for a, b in zip(received, received[1:])]
    return {"polls": changed, "count": len(received), "period": statistics.median(gaps) if gaps else None,
            "method": "stream"}


async def run(urls: list[str], start_at: float, stopped: Stop, deadline: float,
              interval: float, observe: str = "stream", actives: bool = False) -> dict[str, Any]:
    if observe == "stream":
        watches = [watch_node(u, start_at, stopped, deadline) for u in urls]
        if actives:  # ``--actives``: keyed "active <url>"
            watches += [watch_node(u, start_at, stopped, deadline, PartitionState.ACTIVE, f"active {u}") for u in urls]
            urls = [*urls, *(f"active {u}" for u in urls)]
        results = await asyncio.gather(*watches)
    else:
        results = await asyncio.gather(*(poll_node(u, start_at, stopped, deadline, interval) for u in urls))
    return dict(zip(urls, results))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("urls", nargs="+", help="node URLs to poll")
    p.add_argument("--interval-ms", type=float, default=0.0,
                   help="at least this long between the end of one poll and the next (0: back to back)")
    p.add_argument("--observe", choices=("stream", "poll"), default="stream",
                   help="tail the replica partitions (pushed by the node) or poll GET /partitions")
    p.add_argument("--actives", action="store_true",
                   help="with --observe stream, also tail each node's active partitions (when its stream "
                        "server pushes a write to a consumer: the replication sender's pace, for --lag-stages)")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="stop this long after the window's end even without a stop line")
    p.add_argument("--stop-grace", type=float, default=STOP_GRACE_S,
                   help="after a stop line naming seqnos, at most this long to see them")
    args = p.parse_args(argv)
    start_at, stop_at = wait_for_start()
    stopped = Stop(args.stop_grace)

    def wait_for_stop() -> None:
        stopped.set(sys.stdin.readline() or "stop")  # a stop line, or EOF when the benchmark went away

    threading.Thread(target=wait_for_stop, daemon=True).start()
    out = asyncio.run(run(args.urls, start_at, stopped, stop_at + args.max_seconds, args.interval_ms / 1000,
                         args.observe, args.actives))
    sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
