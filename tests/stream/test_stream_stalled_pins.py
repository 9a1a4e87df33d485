"""Consumers that stop draining their sockets must not pin LMDB pages or write-queue roots.

Stalled consumers request every partition from 0 on a non-empty data dir and then never read:
two ask for a huge window, so their sends block (socket buffers full) long before the window
fills; one reads the backlog with the smallest window, then stops acknowledging, so its window
fills with the first frame of a pass whose reader job already holds a later visit's snapshot.  A writer then overwrites the
same keys.  LMDB can reuse the pages freed by those writes only once no read transaction older
than them is open, so a backfill snapshot held for the whole stall makes the data file grow at the
write rate.  Cursor dropping must release every snapshot of a stalled connection after the drop
limit, whatever the window: the file then grows about as much as with no stalled consumer at all.
"""
from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.protocol import frames as F
from tests.support.server import start_server
from tests.support.keys import key_in
from tests.support.wsclient import Mirror, Position, RawStream, write_docs, ws_url

pytestmark = pytest.mark.slow

PARTITIONS = 64
VALUE_B64 = base64.b64encode(b"v" * 1000).decode()
#: ~100 KiB per partition: one reader job (256 KiB of encoded output) completes the first visits of
#: a pass and leaves a later one holding its snapshot, so a stall while sending the first visits
#: happens while *another* visit pins an LMDB read transaction
PRELOAD = 6_400
WRITES = 100_000  # ~100 MiB of overwrites of the preloaded keys
GiB = 1 << 30


def _bulk(client: httpx.Client, keys: range, prefix: str = "k") -> None:
    items = [{"op": "set", "key": f"{prefix}{i % PRELOAD}", "value_b64": VALUE_B64} for i in keys]
    client.post("/docs/_bulk", json=items).raise_for_status()


def _write(url: str, start: int, n: int, per_bulk: int = 1000) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(start, start + n, per_bulk):
            _bulk(client, range(i, i + per_bulk))


def _cursor_drops(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("upr_stream_cursor_drops_total"):
            return float(line.split()[-1])
    return 0.0


async def _window_stalled(url: str) -> RawStream:
    """A consumer that reads the whole backlog, then stops acknowledging with its smallest window
    full (one frame of a big document on partition 0 received, not acknowledged): no pass can
    start until ``_release`` frees the window."""
    st = await RawStream.open(url, name="window-stalled", window=4096, max_queue=1)
    await st.stream(range(PARTITIONS))
    await st.send({"type": "barrier", "cookie": "caught-up"})
    await st.consume(Mirror(), until=lambda m: isinstance(m, dict) and m.get("cookie") == "caught-up")
    await st.ack()
    st.auto_ack = False
    write_docs(url, {key_in(0, "window-filler", partitions=PARTITIONS): b"f" * 8192})
    await st.consume(Mirror(), until=lambda m: isinstance(m, F.ItemBatch))  # 8 KiB unacknowledged
    return st


async def _release(st: RawStream) -> None:
    """Acknowledge what the window-stalled consumer received, once every partition has new data:
    its next pass then visits all of them, its first reader job completes the first visits and
    leaves a later one holding its snapshot, and the first frame sent fills the window again
    inside the first visit, so the stall happens while *another* visit pins a read transaction."""
    await st.ack()


async def _growth(workdir: Path, stalled: int) -> tuple[int, float, dict[str, int]]:
    """data.mdb growth while WRITES overwrites flow, with ``stalled`` consumers that never read
    (the last one with a full window); also the drop counter and each consumer's drops."""
    args = ["--stream-max-window-bytes", str(GiB), "--stream-drop-after-s", "0.5"]
    srv = start_server(workdir, partitions=PARTITIONS, args=args)
    try:
        await asyncio.to_thread(_write, srv.url, 0, PRELOAD)
        srv.stop()
        srv = start_server(workdir, partitions=PARTITIONS, args=args)  # the backlog is all on disk now
        mdb = srv.data_dir / "data.mdb"
        before = mdb.stat().st_size
        streams = []
        if stalled:
            streams.append(await _window_stalled(srv.url))
        for n in range(stalled - 1):
            st = await RawStream.open(srv.url, name=f"socket-stalled-{n}", window=GiB, auto_ack=False, max_queue=1)
            for p in range(PARTITIONS):
                await st.send(Position().request(p))
            streams.append(st)
        # Every key again, in one write batch: more than a frame new on every partition.
        await asyncio.to_thread(_write, srv.url, 0, PRELOAD, PRELOAD)
        if stalled:
            await _release(streams[0])
        await asyncio.sleep(1.0)  # the sends block: socket buffers or the window full, nothing read
        await asyncio.to_thread(_write, srv.url, PRELOAD, WRITES)
        grown = mdb.stat().st_size - before
        drops = _cursor_drops(srv.url)
        listed = {s["name"]: s["cursor_drops"] for s in httpx.get(f"{srv.url}/streams").json()["streams"]}
        for st in streams:
            try:
                await asyncio.wait_for(st.ws.close(), 2)
            except (ConnectionClosed, asyncio.TimeoutError, OSError):
                pass
        return grown, drops, listed
    finally:
        srv.kill()


async def test_stalled_consumers_do_not_grow_the_data_file(tmp_path: Path) -> None:
    baseline, _, _ = await _growth(tmp_path / "baseline", stalled=0)
    grown, drops, listed = await _growth(tmp_path / "stalled", stalled=3)
    print(f"data.mdb grew {grown / 2**20:.0f} MiB with 3 stalled consumers, {baseline / 2**20:.0f} MiB without; "
          f"{drops:.0f} snapshots released {listed}")
    assert drops >= 1, "no snapshot of a stalled consumer was released (cursor dropping never fired)"
    assert listed["window-stalled"] >= 1, listed  # its window filled in a visit before the one holding
    assert grown <= 2 * baseline + 32 * 2**20, (
        f"data.mdb grew {grown / 2**20:.0f} MiB with stalled consumers, {baseline / 2**20:.0f} MiB without")


async def test_window_above_the_cap_is_refused_with_a_typed_error(tmp_path: Path) -> None:
    """Windows above ``--stream-max-window-bytes`` (64 MiB by default) are refused at hello."""
    srv = start_server(tmp_path, partitions=2)
    try:
        async with connect(ws_url(srv.url)) as ws:
            await ws.send(json.dumps({"type": "hello", "name": "greedy", "window_bytes": GiB, "protocol": 1}))
            error = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert error["type"] == "error" and error["code"] == "invalid_field" and error["field"] == "window_bytes"
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    finally:
        srv.kill()
