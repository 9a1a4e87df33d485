"""Consumers that stop draining their sockets must not pin LMDB pages or write-queue roots.

Stalled consumers ask for a huge window, request every partition from 0 on a non-empty data dir
and then never read: their sends block long before the window fills.  A writer then overwrites the
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

from tests.conftest import start_server
from tests.stream.wsclient import RawStream, ws_url

pytestmark = pytest.mark.slow

PARTITIONS = 64
VALUE_B64 = base64.b64encode(b"v" * 1000).decode()
PRELOAD = 8_000  # ~8 MiB: a few frames per partition, so one reader job covers several visits
WRITES = 100_000  # ~100 MiB of overwrites of the preloaded keys
GiB = 1 << 30


def _bulk(client: httpx.Client, keys: range, prefix: str = "k") -> None:
    items = [{"op": "set", "key": f"{prefix}{i % PRELOAD}", "value_b64": VALUE_B64} for i in keys]
    client.post("/docs/_bulk", json=items).raise_for_status()


def _write(url: str, start: int, n: int) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(start, start + n, 1000):
            _bulk(client, range(i, i + 1000))


def _cursor_drops(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("upr_stream_cursor_drops_total"):
            return float(line.split()[-1])
    return 0.0


async def _growth(workdir: Path, stalled: int) -> tuple[int, float]:
    """data.mdb growth while WRITES overwrites flow, with ``stalled`` consumers that never read."""
    args = ["--stream-max-window-bytes", str(GiB), "--stream-drop-after-s", "0.5"]
    srv = start_server(workdir, partitions=PARTITIONS, args=args)
    try:
        await asyncio.to_thread(_write, srv.url, 0, PRELOAD)
        srv.stop()
        srv = start_server(workdir, partitions=PARTITIONS, args=args)  # the backlog is all on disk now
        mdb = srv.data_dir / "data.mdb"
        before = mdb.stat().st_size
        streams = []
        for n in range(stalled):
            st = await RawStream.open(srv.url, name=f"stalled-{n}", window=GiB, auto_ack=False, max_queue=1)
            for p in range(PARTITIONS):
                await st.send({"type": "stream_request", "partition": p, "uuid": 0, "start_seqno": 0,
                               "snap_start": 0, "snap_end": 0})
            streams.append(st)
        await asyncio.sleep(1.0)  # the sends block: socket buffers full, nothing read
        await asyncio.to_thread(_write, srv.url, PRELOAD, WRITES)
        grown = mdb.stat().st_size - before
        drops = _cursor_drops(srv.url)
        for st in streams:
            try:
                await asyncio.wait_for(st.ws.close(), 2)
            except (ConnectionClosed, asyncio.TimeoutError, OSError):
                pass
        return grown, drops
    finally:
        srv.kill()


async def test_stalled_consumers_do_not_grow_the_data_file(tmp_path: Path) -> None:
    baseline, _ = await _growth(tmp_path / "baseline", stalled=0)
    grown, drops = await _growth(tmp_path / "stalled", stalled=3)
    print(f"data.mdb grew {grown / 2**20:.0f} MiB with 3 stalled consumers, {baseline / 2**20:.0f} MiB without; "
          f"{drops:.0f} snapshots released")
    assert drops >= 1, "no snapshot of a stalled consumer was released (cursor dropping never fired)"
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
