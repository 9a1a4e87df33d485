"""Shared passes carried out on the hub's delivery (``PassSender._direct_pass``), without waking
the sender task: each consumer receives exactly what a lone consumer would (every write once, in
seqno order per partition, snapshot markers covering them), cookies still come back, and the
sender task is woken far less often than once per pass.

In process: a real engine and ``StreamServer``; the WebSockets are stand-ins whose scope offers
direct transport writes as uvicorn's sans-I/O protocol does (``app.stream.rawframes``), so the
direct path is taken exactly as behind a real uvicorn (the end-to-end shared-pass test covers
that server)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from app.stream.connection import StreamLimits
from app.stream.pacing import WakePacer
from engine.core.types import Op, WriteOp
from engine.protocol.bundle import decode_bundle
from engine.protocol.frames import decode_binary
from tests.support.raw_transport import InProcessStreams, raw_scope

PARTITIONS = 4


class Consumer:
    """A bundling binary consumer that keeps what it receives and acknowledges it at once."""

    def __init__(self, name: str, raw: bool) -> None:
        self.client = None
        self.scope = raw_scope(self._frame) if raw else {}
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.direct = 0
        self.items: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        self.snap_end: dict[int, int] = {p: 0 for p in range(PARTITIONS)}
        self.barriers: list[str] = []
        self.largest = 0  # the largest message received
        #: bundles carrying items but not their pass's end (``cycle_complete``): a pass in several
        self.unfinished = 0
        self.put({"type": "hello", "name": name, "codec": "binary", "window_bytes": 1 << 20, "protocol": 1,
                  "bundle": True})
        for p in range(PARTITIONS):
            self.put({"type": "stream_request", "partition": p, "uuid": 0, "start_seqno": 0, "snap_start": 0,
                      "snap_end": 0})

    def put(self, obj: dict[str, Any]) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(obj)})

    def _frame(self, parts: Any) -> None:
        parts = list(parts)
        self.direct += 1
        payload = b"".join(parts[1:])  # the first part is the frame header
        text = parts[0][0] & 0x0F == 0x1
        self.got(payload.decode() if text else payload)

    def got(self, data: bytes | str) -> None:
        self.largest = max(self.largest, len(data))
        parts = decode_bundle(data) if isinstance(data, bytes) else [data]
        if len(parts) > 1 and isinstance(parts[-1], bytes):
            self.unfinished += 1
        for part in parts:
            if isinstance(part, bytes):
                batch = decode_binary(part)
                seqnos = list(batch.seqnos)
                assert all(s <= self.snap_end[batch.partition] for s in seqnos), "an item outside its snapshot"
                self.items[batch.partition] += seqnos
                continue
            msg = json.loads(part)
            if msg["type"] == "snapshot":
                self.snap_end[msg["partition"]] = msg["end"]
            elif msg["type"] == "barrier":
                self.barriers.append(msg["cookie"])
        self.put({"type": "ack", "bytes": len(data)})

    async def accept(self) -> None:
        pass

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send_text(self, data: str) -> None:
        self.got(data)

    async def send_bytes(self, data: bytes) -> None:
        self.got(data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.inbox.put_nowait({"type": "websocket.disconnect"})


async def _fan_out(tmp: Path, raw: bool, consumers: int = 12, writes: int = 120, limits: StreamLimits | None = None
                   ) -> tuple[list[Consumer], list[Any], dict[int, list[int]]]:
    streams = InProcessStreams(tmp / "data", PARTITIONS, limits)
    engine, runner, server = streams.engine, streams.runner, streams.server
    server.hub.pacer = WakePacer(max_spacing_s=0.001)  # paced as under load, quickly
    socks = [Consumer(f"c{i}", raw) for i in range(consumers)]
    streams.serve(socks)
    written: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    try:
        for i in range(writes):
            (res,) = await runner.write(engine.write_batch, [WriteOp(Op.MUTATION, f"k{i}", b"v")])
            written[res.partition].append(res.seqno)
            if i % 40 == 39:
                for ws in socks:
                    ws.put({"type": "barrier", "cookie": f"c{i}"})
            if i % 3 == 0:
                await asyncio.sleep(0)
        for _ in range(2000):
            if all(ws.items == written and len(ws.barriers) == writes // 40 for ws in socks):
                break
            await asyncio.sleep(0.005)
        conns = list(server.streams._handles.values())  # noqa: SLF001 - the test reads the counters
    finally:
        await streams.close()
    return socks, conns, written


async def test_direct_passes_deliver_what_a_lone_consumer_gets_with_few_task_wakeups(tmp_path: Path) -> None:
    socks, conns, written = await _fan_out(tmp_path, raw=True)
    for ws in socks:
        assert ws.items == written  # every write once, in seqno order, inside its snapshot
        assert ws.barriers == [f"c{i}" for i in range(39, 120, 40)]
    direct = sum(c.direct_passes for c in conns)
    wakeups = sum(c.sender_wakeups for c in conns)
    assert direct > 0
    assert wakeups < sum(c.shared_sent for c in conns)  # most passes woke no task


async def test_without_direct_writes_the_sender_task_does_the_passes(tmp_path: Path) -> None:
    socks, conns, written = await _fan_out(tmp_path, raw=False, consumers=8, writes=80)
    for ws in socks:
        assert ws.items == written
        assert ws.direct == 0
    assert sum(c.direct_passes for c in conns) == 0


async def test_a_failing_direct_pass_ends_its_connection_only(tmp_path: Path) -> None:
    """The pass runs inside the hub's delivery: its failure must not stop the delivery to the
    other connections; the sender task raises it and that connection ends."""
    streams = InProcessStreams(tmp_path / "data", PARTITIONS)
    engine, runner, server = streams.engine, streams.runner, streams.server
    socks = [Consumer(f"c{i}", raw=True) for i in range(3)]
    streams.serve(socks)
    try:
        for _ in range(200):
            conns = list(server.streams._handles.values())  # noqa: SLF001 - the test reaches the connections
            if len(conns) == 3 and all(len(c.session.streams) == PARTITIONS for c in conns):
                break
            await asyncio.sleep(0.01)
        victim = conns[0]

        def broken() -> bool:
            raise RuntimeError("boom")

        victim._direct_pass = broken  # type: ignore[method-assign]
        written: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        for i in range(20):
            (res,) = await runner.write(engine.write_batch, [WriteOp(Op.MUTATION, f"k{i}", b"v")])
            written[res.partition].append(res.seqno)
            await asyncio.sleep(0)
        for _ in range(1000):
            if all(ws.items == written for ws in socks[1:]) and victim._done.is_set():  # noqa: SLF001
                break
            await asyncio.sleep(0.005)
        assert victim._done.is_set()  # noqa: SLF001 - the failing connection ended
        for ws in socks[1:]:
            assert ws.items == written
    finally:
        await streams.close()


async def test_own_visits_sent_without_suspending_deliver_what_a_lone_consumer_gets(tmp_path: Path) -> None:
    """Shared passes off: each connection produces its own visits, and those that cannot wait
    (complete, within the window and the pending bundle) are sent without suspending
    (``PassSender._send_visit_now``); every write still arrives once, in order, inside its
    snapshot, and every cookie comes back."""
    socks, conns, written = await _fan_out(tmp_path, raw=True, consumers=8, writes=80,
                                           limits=StreamLimits(shared_passes=False))
    for ws in socks:
        assert ws.items == written
        assert ws.barriers == [f"c{i}" for i in range(39, 80, 40)]
    assert sum(c.shared_sent for c in conns) == 0
    assert sum(c.visits_now for c in conns) > 0


async def test_a_pass_larger_than_a_bundle_goes_out_on_the_delivery_in_several(tmp_path: Path) -> None:
    """Each write touches every partition with ~1 KiB of items: its pass does not fit one bundle
    of 2 KiB, and is still carried out on the hub's delivery, in several full bundles."""
    streams = InProcessStreams(tmp_path / "data", PARTITIONS, StreamLimits(bundle_bytes=2048))
    engine, runner, server = streams.engine, streams.runner, streams.server
    server.hub.pacer.gather_s = 0
    socks = [Consumer(f"c{i}", True) for i in range(3)]
    streams.serve(socks)
    written: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    try:
        for i in range(20):
            ops = [WriteOp(Op.MUTATION, f"k{i}-{j}", b"v" * 100) for j in range(24)]
            for res in await runner.write(engine.write_batch, ops):
                written[res.partition].append(res.seqno)
            for _ in range(400):
                if all(ws.items == written for ws in socks):
                    break
                await asyncio.sleep(0.005)
        conns = list(server.streams._handles.values())  # noqa: SLF001 - the test reads the counters
    finally:
        await streams.close()
    for ws in socks:
        assert ws.items == written  # every write once, in seqno order, inside its snapshot
        assert ws.largest <= 2048
    assert sum(c.direct_passes for c in conns) > 0  # such passes were taken on the delivery
    assert all(ws.unfinished for ws in socks)  # in more than one bundle each


async def test_hello_and_stream_requests_are_answered_without_a_reader_hop_each(tmp_path: Path) -> None:
    """A consumer's hello and stream requests are answered from the partitions' memory on the
    loop: a consumer opening many streams on a busy node does not wait one reader-thread hop per
    request (one at a time, behind the node's other reader work) before its first data."""
    streams = InProcessStreams(tmp_path / "data", PARTITIONS)
    runner, server = streams.runner, streams.server
    hopped: list[str] = []
    read = runner.read

    async def counting_read(fn: Any, *args: Any) -> Any:
        hopped.append(getattr(fn, "__name__", repr(fn)))
        return await read(fn, *args)

    runner.read = counting_read  # type: ignore[method-assign]
    ws = Consumer("opener", raw=True)
    streams.serve([ws])
    try:
        for _ in range(400):
            conns = list(server.streams._handles.values())  # noqa: SLF001 - the test reaches the connection
            if conns and len(conns[0].session.streams) == PARTITIONS:
                break
            await asyncio.sleep(0.005)
        assert conns and len(conns[0].session.streams) == PARTITIONS  # every stream open
        assert "_partition_infos" not in hopped
    finally:
        await streams.close()
