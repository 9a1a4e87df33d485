"""CPU of a replica's receive path per message and per item, in one process, without sockets.

What a replicating node does with what its active streams, counted apart from the HTTP route
and the sender: each take is a list of frames as they come off the WebSocket (a snapshot marker
as text and a binary item batch per partition visit, as a tail pass sends them), decoded as the
connection decodes them (``clients.connection``: ``decode_frame``), then processed as
``ReplicationStreams._process`` processes them on a real engine (the session's positions, the
inline apply, the copy's sync, the acker's wake-up, flow control).  The flusher runs as on a
node, so the queue is persisted between takes.  CPU is the loop thread's ``thread_time`` (the
flusher's is not in it; ``bench.cluster_cpu`` counts it on a node).

    PYTHONPATH=. python -m bench.replica_apply_cpu --takes 400

The shape matters more than the rate: ``items`` per partition visit (1 at a tail's pace, as
``bench.cluster_cpu`` at 5,000/s spreads 25 writes over 32 partitions) and ``visits`` per take
(how many partition visits the applier finds waiting when it wakes).
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from app.cluster.replication import ReplicaAcker, ReplicationStreams
from app.stream.cursor import marker_text
from engine.config import EngineConfig
from engine.core.types import FailoverEntry, Item, PartitionState
from engine.engine import Engine
from engine.protocol.client.incoming import decode_frame
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.position import PartitionPosition
from engine.protocol.client.session import ClientSession, RollbackPolicy
from engine.protocol.frames import encode_binary
from engine.protocol.packed import encode_packed

UUID = 77


class _NoConn:
    """Flow-control acks go nowhere (their count is printed)."""

    def __init__(self) -> None:
        self.sent = 0

    async def send(self, msg: Any) -> None:
        self.sent += 1


def _frames(partitions: int, visits: int, items: int, seqnos: dict[int, int], counter: list[int],
            packed: bool = False) -> list[tuple[str | bytes, int]]:
    """One take: ``visits`` partition visits (marker text + binary batch of ``items``), or with
    ``packed`` the same visits as one packed pass (hello ``frames: packed``)."""
    out: list[tuple[str | bytes, int]] = []
    sections = []
    for _ in range(visits):
        p = counter[0] % partitions
        counter[0] += 1
        start = seqnos[p] + 1
        batch = [Item(b"lag-%d-%d" % (p, s), s, 1_000_000 + s, 1, False, b"v" * 180)
                 for s in range(start, start + items)]
        seqnos[p] = start + items - 1
        marker = marker_text(p, start, seqnos[p], "memory", 0)
        frame = encode_binary(p, batch, True)
        out += [(marker, len(marker)), (frame, len(frame))]
        sections.append((p, (start, seqnos[p], "memory", 0), frame))
    if packed:
        data = encode_packed(sections)
        return [(data, len(data))]
    return out


async def _measure(engine: Engine, partitions: int, takes: int, visits: int, items: int,
                   packed: bool = False) -> dict[str, float]:
    streams = ReplicationStreams(engine, "bench", None, None, lambda: 0)  # type: ignore[arg-type]
    acker = ReplicaAcker(engine, 1.0)
    session = ClientSession(partitions=list(range(partitions)),
                            offsets={p: StreamOffset.beginning() for p in range(partitions)},
                            on_rollback=RollbackPolicy.REPORT)
    for p in range(partitions):  # what the handshake and each stream's ``ok`` leave behind
        session.positions[p] = PartitionPosition(p, StreamOffset.beginning(), ())
        session.request_for(p)
        session.stream_ok(p, (FailoverEntry(UUID, 0),))
    conn = _NoConn()
    seqnos = {p: engine.high_seqno(p) for p in range(partitions)}
    counter = [0]
    takes_frames = [_frames(partitions, visits, items, seqnos, counter, packed) for _ in range(takes)]
    decode_s = process_s = 0.0
    for frames in takes_frames:
        t0 = time.thread_time()
        received = [(decode_frame(f), n) for f, n in frames]
        t1 = time.thread_time()
        acker.begin_take()
        await streams._process(conn, session, acker, received)  # type: ignore[arg-type]
        acker.end_take()
        t2 = time.thread_time()
        decode_s += t1 - t0
        process_s += t2 - t1
        await asyncio.sleep(0.002)  # the flusher's turn, as between a node's takes
    received = sum(map(len, takes_frames))
    return {"decode": decode_s, "process": process_s, "items": takes * visits * items,
            "received": received,
            "inline": streams.inline, "hops": streams.hops, "flow_acks": conn.sent}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--takes", type=int, default=400)
    p.add_argument("--partitions", type=int, default=32)
    p.add_argument("--shapes", default="1x1,1x8,1x32,5x8,25x8",
                   help="items per visit x visits per take, comma-separated")
    p.add_argument("--frames", default="messages,packed",
                   help="comma-separated: messages (a marker and a batch per visit), packed (one packed pass per take)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="upr-bench-replica-"))
    try:
        runs = [(shape, frames) for shape in args.shapes.split(",") for frames in args.frames.split(",")]
        for shape, frames in runs:
            items, visits = (int(x) for x in shape.split("x"))
            engine = Engine.open(EngineConfig(data_dir=work / f"{shape}-{frames}", partitions=args.partitions))
            try:
                for part in range(args.partitions):
                    engine.set_state(part, PartitionState.REPLICA)
                    engine.adopt_failover_log(part, (FailoverEntry(UUID, 0),))
                r = asyncio.run(_measure(engine, args.partitions, args.takes, visits, items, frames == "packed"))
            finally:
                engine.close()
            n_visits = args.takes * visits
            per_visit = (r["decode"] + r["process"]) / n_visits * 1e6
            print(f"{frames:8s} {items} item(s) per visit, {visits} visit(s) per take: {r['received'] / args.takes:.0f} "
                  f"message(s) per take; per visit {per_visit:.1f} µs "
                  f"(decode {r['decode'] / n_visits * 1e6:.1f}, process {r['process'] / n_visits * 1e6:.1f}); "
                  f"per item {(r['decode'] + r['process']) / r['items'] * 1e6:.1f} µs; per take "
                  f"{(r['decode'] + r['process']) / args.takes * 1e6:.0f} µs; applied inline {r['inline']}, "
                  f"on a thread {r['hops']}, flow acks {r['flow_acks']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
