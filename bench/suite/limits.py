"""The machine's limits, measured in the same run so our figures read as a fraction of them.

* LMDB ``putmulti(append=True)`` of 200-byte values in transactions of 1000, ``sync`` on (each
  commit fsyncs): what any LMDB-backed ingest path could reach; upr's ingest is shown against it.
* LMDB cursor scan with values copied out: the read side; upr's backfill is shown against it.
* Frames/s a FastAPI + uvicorn (uvloop, httptools) WebSocket endpoint sends to a ``websockets``
  client in another process, at 1 KiB and 64 KiB; the 64 KiB figure is also expressed as 200-byte
  documents/s, the transport ceiling for a backfill that packs documents into such frames.
"""

from __future__ import annotations

import importlib.metadata
import sys
import time

from bench.suite.docs import DOC_SIZE, make_doc
from bench.suite.procs import free_port, wait_for_port
from bench.suite.results import Row
from bench.suite.stats import rate
from bench.suite.workloads import Ctx


def lmdb_rows(ctx: Ctx) -> list[Row]:
    import lmdb

    n = ctx.sizes.lmdb_n
    path = ctx.workdir / "lmdb"
    path.mkdir()
    values = [make_doc(i) for i in range(1000)]
    env = lmdb.open(str(path), map_size=max(1 << 30, n * 512), sync=True, metasync=True)
    try:
        t0 = time.monotonic()
        for first in range(0, n, 1000):
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(
                    [(b"%016d" % i, values[i % 1000]) for i in range(first, min(n, first + 1000))], append=True
                )
        put_s = time.monotonic() - t0
        t0 = time.monotonic()
        count = 0
        with env.begin(buffers=False) as txn:
            for _k, v in txn.cursor():
                count += len(v) > 0
        scan_s = time.monotonic() - t0
    finally:
        env.close()
    if count != n:
        raise RuntimeError(f"LMDB scan saw {count} of {n} items")
    ver = f"py-lmdb {importlib.metadata.version('lmdb')}, LMDB {'.'.join(map(str, lmdb.version()))}"
    return [
        Row("limit: LMDB putmulti", "limit", rate(n, put_s), "items/s", compare_to="ingest",
            metrics={"n": n, "seconds": put_s},
            detail=f"{n:,} × {DOC_SIZE} B, append, txns of 1000, sync; {ver}"),
        Row("limit: LMDB cursor scan", "limit", rate(n, scan_s), "items/s", compare_to="backfill",
            metrics={"n": n, "seconds": scan_s}, detail=f"{n:,} items, values copied; {ver}"),
    ]


async def ws_rows(ctx: Ctx) -> list[Row]:
    import websockets

    port = free_port()
    log = ctx.workdir / "uvicorn.log"
    proc = ctx.procs.spawn(
        [sys.executable, "-m", "uvicorn", "bench.suite.limits_app:app", "--host", "127.0.0.1", "--port", str(port),
         "--loop", "uvloop", "--http", "httptools", "--log-level", "warning", "--no-access-log"],
        name="uvicorn-limits", log=log,
    )
    wait_for_port(port, proc, log)
    rows = []
    try:
        for size, count in ctx.sizes.ws_frames:
            got = 0
            t0 = time.monotonic()
            async with websockets.connect(f"ws://127.0.0.1:{port}/frames?size={size}&count={count}", max_size=None,
                                          compression=None) as ws:
                async for frame in ws:
                    got += 1
                    if len(frame) != size:
                        raise RuntimeError(f"frame of {len(frame)} bytes, expected {size}")
            elapsed = time.monotonic() - t0
            if got != count:
                raise RuntimeError(f"received {got} of {count} frames")
            fps = rate(count, elapsed)
            mbps = fps * size / 1e6
            versions = ", ".join(f"{d} {importlib.metadata.version(d)}" for d in ("fastapi", "uvicorn", "websockets"))
            if size >= 65536:
                rows.append(Row(f"limit: WebSocket {size // 1024} KiB frames", "limit", fps * size / DOC_SIZE,
                                "200-B docs/s", compare_to="backfill",
                                metrics={"frames_per_s": fps, "mb_per_s": mbps, "count": count},
                                detail=f"{fps:,.0f} frames/s = {mbps:,.0f} MB/s; {versions}"))
            else:
                rows.append(Row(f"limit: WebSocket {size} B frames", "limit", fps, "frames/s",
                                metrics={"frames_per_s": fps, "mb_per_s": mbps, "count": count},
                                detail=f"{mbps:,.0f} MB/s; {versions}"))
    finally:
        ctx.procs.stop(proc)
    return rows


async def limits(ctx: Ctx) -> list[Row]:
    return [*lmdb_rows(ctx), *(await ws_rows(ctx))]
