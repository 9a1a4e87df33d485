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
  ``--interval-ms`` between two).

The process connects (for a tail: hello and every stream open, ``Window``), then says ``ready``,
is released with a window (``bench.cluster_procs.release_together``), observes from the
window's start until a ``stop`` line on stdin (the benchmark sends it once the replicas hold
every acknowledged write, naming those seqnos: ``Stop`` then waits until it has seen them, or a
grace) or ``--max-seconds`` past the window's end.  Only polls that show a change are printed
(the first poll covering a seqno always shows one, so the lags computed from them are the
same), with the count and median period of all polls: the method's resolution.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable
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



class Window:
    """The measuring window, shared by the observations of one process: each says ``ready`` once
    it is set up (connected; for a tail, every stream open), and the process tells the benchmark
    it is ready only when all are (``bench.cluster_procs.wait_for_start``).

    WHY: a tail's stream requests are answered one by one, each after a read on the node's reader
    threads; on a loaded node opening 32 of them took seconds.  A window released before they
    were all open counted the time a partition's stream took to open as that partition's
    replication lag (the writes are not lost: the stream starts at the high seqno of the hello,
    so they arrive when it opens, seconds after their ack)."""

    def __init__(self, observations: int, on_release: Callable[[], None] | None = None) -> None:
        self._waiting = observations
        self._on_release = on_release
        self._all_ready = asyncio.Event()
        self._times: asyncio.Future[tuple[float, float]] = asyncio.get_running_loop().create_future()

    async def ready(self) -> tuple[float, float]:
        """Say this observation is set up; the window's ``(start_at, stop_at)`` once released."""
        self._waiting -= 1
        if self._waiting <= 0:
            self._all_ready.set()
        return await self._times

    async def release(self) -> None:
        """Once every observation is ready: the benchmark's handshake (on a thread: it reads stdin)."""
        await self._all_ready.wait()
        times = await asyncio.to_thread(wait_for_start)
        if self._on_release is not None:
            self._on_release()
        self._times.set_result(times)


async def poll_node(url: str, window: Window, stopped: Stop, max_seconds: float,
                    interval: float) -> dict[str, Any]:
    conn = await RawConnection.open(url)
    changed: list[tuple[float, float, dict[int, int]]] = []
    received: list[float] = []
    last: dict[int, int] | None = None
    try:
        status, _ = await conn.request("GET", "/partitions")  # connected and answering
        start_at, stop_at = await window.ready()
        deadline = stop_at + max_seconds
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


async def watch_node(url: str, window: Window, stopped: Stop, max_seconds: float,
                     state: PartitionState = PartitionState.REPLICA, key: str | None = None) -> dict[str, Any]:
    """Tail the node's replica partitions (``state``: or its active ones) from their high
    seqnos; a record per message that moved a high seqno.  Ready for the window once every
    stream is open (``opened``: how long after the hello each stream's answer came)."""
    ws_url = "ws" + url.removeprefix("http") + "/stream"
    changed: list[tuple[float, float, dict[int, int]]] = []
    received: list[float] = []
    opened: dict[int, float] = {}
    async with connect(ws_url, max_size=64 << 20, ping_interval=None) as ws:
        hello_at = time.monotonic()
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

        def take(frame: str | bytes, at: float) -> bool:
            """Whether ``frame`` moved a high seqno; stream answers are noted in ``opened``."""
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
                    if isinstance(msg, M.StreamResponse):
                        if msg.status is not M.StreamStatus.OK:
                            raise RuntimeError(f"{url}: partition {msg.partition} refused: {msg}")
                        opened[msg.partition] = at - hello_at
            return moved

        while len(opened) < len(highs):  # every stream open before the window
            frame = await ws.recv()
            take(frame, time.monotonic())
            pending += len(frame)
        start_at, stop_at = await window.ready()
        deadline = stop_at + max_seconds
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
            if take(frame, at) and at >= start_at:
                changed.append((at, at, dict(highs)))
            pending += len(frame)
            if pending >= ACK_BYTES:
                await ws.send(M.encode(M.Ack(pending)))
                pending = 0
    gaps = [b - a for a, b in zip(received, received[1:])]
    return {"polls": changed, "count": len(received), "period": statistics.median(gaps) if gaps else None,
            "method": "stream", "opened_s": max(opened.values(), default=None)}


async def run(urls: list[str], stopped: Stop, max_seconds: float, interval: float, observe: str = "stream",
              actives: bool = False, on_release: Callable[[], None] | None = None) -> dict[str, Any]:
    """Every observation set up, then the benchmark's window (``Window``), then observed until
    the stop line (``Stop``) or ``max_seconds`` past the window's end."""
    keys = [*urls, *(f"active {u}" for u in urls)] if observe == "stream" and actives else list(urls)
    window = Window(len(keys), on_release)
    if observe == "stream":
        watches = [watch_node(u, window, stopped, max_seconds) for u in urls]
        if actives:  # ``--actives``: keyed "active <url>"
            watches += [watch_node(u, window, stopped, max_seconds, PartitionState.ACTIVE, f"active {u}")
                        for u in urls]
    else:
        watches = [poll_node(u, window, stopped, max_seconds, interval) for u in urls]
    tasks = [asyncio.ensure_future(w) for w in watches]
    released = asyncio.ensure_future(window.release())
    try:
        results = await asyncio.gather(*tasks)
    finally:
        released.cancel()
    return dict(zip(keys, results))


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
    stopped = Stop(args.stop_grace)

    def wait_for_stop() -> None:
        stopped.set(sys.stdin.readline() or "stop")  # a stop line, or EOF when the benchmark went away

    # stdin's next line after the window's: read once the window is (``Window.release``)
    out = asyncio.run(run(args.urls, stopped, args.max_seconds, args.interval_ms / 1000, args.observe, args.actives,
                          on_release=lambda: threading.Thread(target=wait_for_stop, daemon=True).start()))
    sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
