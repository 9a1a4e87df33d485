"""Our rows: the upr server as a :class:`~bench.suite.adapter.System`, measured like the peers.

Server: ``python -m app.cli server`` on 127.0.0.1 with port 0 (the bound URL comes back through
``--ready-file``), a fresh data dir per workload (a restart is upr's "empty the feed").
Writer: ``POST /docs/_bulk?durability=persist`` with a JSON array of ``set`` items, through the
client library's ``AsyncHttpApi.bulk_bytes`` (what a user's async writer calls: keep-alive
HTTP/1.1, typed errors); the response comes after the batch is fsynced (the ack), and is checked
for per-item failures.
Reader: the stream protocol at ``GET /stream`` spoken directly with ``engine.protocol``: hello
with the binary codec and a 64 MiB window, one ``stream_request`` per partition (from seqno 0, or
from each partition's high seqno for "now"), the values cut out of each batch with
``frames.live_values`` (the frame checked as ``decode_binary`` checks it, only the values copied)
and snapshot markers skipped unparsed, acks every half window. This is the fastest path a Python consumer has; the
``clients`` library adds its bookkeeping on top of the same frames.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from bench.suite.adapter import Doc, Start, System
from bench.suite.install import InstallLog, Skip
from bench.suite.procs import ProcessGroup, StartError, log_tail

WINDOW = 64 << 20
# text parts a tailing reader skips unread: snapshot markers and cycle ends (what it must act on,
# stream responses, stream ends and errors, is decoded by ``control``)
_ROUTINE = (b'{"type":"snapshot",', b'{"type":"cycle_complete",')
_ROUTINE_LEN = max(map(len, _ROUTINE))
_REPO = Path(__file__).resolve().parents[2]


class UprSystem(System):
    name = "upr"
    label = "upr"
    stream_module = "bench.suite.upr"
    durability = "durability=persist (ack = bulk response after the LMDB commit is fsynced)"
    method = {
        "ingest": "POST /docs/_bulk?durability=persist&results=columns, 1000 items per request",
        "backfill": "GET /stream, binary codec, every partition from seqno 0",
        "tail": "GET /stream, binary codec, every partition from its high seqno",
        "fanout": "one WebSocket connection per consumer",
    }

    write_durability = "persist"

    def __init__(self) -> None:
        self.url = ""
        self._procs: ProcessGroup | None = None
        self._proc: subprocess.Popen[Any] | None = None
        self._workdir = Path()
        self._generation = 0
        self._http: Any = None

    def prepare(self, log: InstallLog) -> dict[str, str]:
        try:
            import app.cli  # noqa: F401
            import engine.engine  # noqa: F401
            import engine.protocol.frames  # noqa: F401
            import engine.protocol.messages  # noqa: F401
        except ImportError as exc:
            raise Skip(f"upr is not importable yet: {exc}") from None
        rev = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False).stdout.strip()
        return {"upr": f"{importlib.metadata.version('upr')} ({rev or 'no git'})",
                "fastapi": importlib.metadata.version("fastapi"), "uvicorn": importlib.metadata.version("uvicorn"),
                "lmdb": importlib.metadata.version("lmdb"), "websockets": importlib.metadata.version("websockets")}

    async def start(self, procs: ProcessGroup, workdir: Path) -> None:
        self._procs, self._workdir = procs, workdir
        await self._boot()

    async def _boot(self) -> None:
        import httpx

        assert self._procs is not None
        self._generation += 1
        base = self._workdir / f"upr-{self._generation}"
        base.mkdir(parents=True)
        ready, log = base / "ready", base / "server.log"
        self._proc = self._procs.spawn(
            [sys.executable, "-m", "app.cli", "server", "--data-dir", str(base / "data"), "--host", "127.0.0.1",
             "--port", "0", "--ready-file", str(ready), "--log-level", "warning",
             # every consumer connects from 127.0.0.1: fan-out beyond the default per-client limit (100)
             "--stream-max-connections-per-client", "1000",
             # a consumer many seconds behind reads the server's ping only after the data queued
             # before it: the suite measures that lag, so the dead-peer check must not end it
             "--ws-ping-timeout-s", "600"],
            name="upr", log=log, cwd=_REPO,
        )
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self._proc.poll() is not None:
                raise StartError(f"upr server exited with {self._proc.returncode}: {log_tail(log)}")
            if time.monotonic() > deadline:
                raise StartError(f"upr server not ready after 60s: {log_tail(log)}")
            time.sleep(0.05)
        self.url = ready.read_text().strip()
        self._http = httpx.AsyncClient(base_url=self.url, timeout=120)

    async def reset(self, *, empty: bool = True) -> None:
        if not empty and self._proc is not None and self._proc.poll() is None:
            return
        if self._http is not None:
            await self._http.aclose()
        if self._proc is not None and self._procs is not None:
            code = self._procs.stop(self._proc, timeout=30)
            if code not in (0, None, -2, -15):
                raise RuntimeError(f"upr server stopped with exit code {code}")
        await self._boot()

    async def writer(self) -> _Writer:
        from clients.http import AsyncHttpApi

        return _Writer(AsyncHttpApi(self.url, timeout=120), self.write_durability)

    async def metrics_text(self) -> str:
        """The server's Prometheus text (the tail workload keeps it beside its timings)."""
        r = await self._http.get("/metrics")
        r.raise_for_status()
        return str(r.text)

    def consumer_conn(self) -> dict[str, Any]:
        return {"ws_url": self.url.replace("http://", "ws://", 1) + "/stream"}

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


class UprMemorySystem(UprSystem):
    """The same server written with ``durability=memory``: the ack class of Redis everysec and
    JetStream (acknowledged before fsync; upr's flusher persists within ``flush_interval_ms``)."""

    name = "upr-memory"
    label = "upr, durability=memory"
    durability = "durability=memory (ack once queued in memory; the flusher fsyncs within flush_interval_ms)"
    method = {
        "ingest": "POST /docs/_bulk?durability=memory&results=columns, 1000 items per request",
        "tail": "GET /stream, binary codec, every partition from its high seqno",
    }
    only = ("ingest", "tail")
    write_durability = "memory"


class _Writer:
    def __init__(self, api: Any, durability: str) -> None:
        self._api = api  # clients.http.AsyncHttpApi
        self._durability = durability

    async def write(self, docs: Sequence[Doc]) -> None:
        # the documents are JSON text already: the items are formatted around them, not re-encoded
        body = b"[" + b",".join(b'{"op":"set","key":"%s","value":%s}' % (k.encode(), d) for k, d in docs) + b"]"
        out = await self._api.bulk_bytes(body, durability=self._durability, columns=True)
        if out.get("failed") or out.get("succeeded") != len(docs):
            raise RuntimeError(f"bulk: {out.get('succeeded')} succeeded, {out.get('failed')} failed of {len(docs)}")

    async def close(self) -> None:
        await self._api.aclose()


async def open_stream(conn: dict[str, Any], start: Start, ident: int) -> AsyncIterator[list[bytes | str]]:
    import websockets

    from engine.protocol import messages as m
    from engine.protocol.bundle import BUNDLE_MAGIC, PART_BINARY, bundle_spans
    from engine.protocol.frames import live_values

    # open_timeout: with 200 consumers connecting at once on a loaded machine the server's loop
    # answers the upgrades behind every other consumer's stream requests (websockets' default is
    # 10 s); the suite measures lag once every consumer is connected, not how fast they connect.
    # No client keepalive: a consumer seconds behind reads the server's pong only after the data
    # queued before it, and websockets would close the connection (1011) after 20 s of that
    async with websockets.connect(conn["ws_url"], max_size=None, compression=None, open_timeout=120,
                                  ping_interval=None) as ws:
        await ws.send(m.encode(m.Hello(name=f"bench-{ident}", codec=m.Codec.BINARY, window_bytes=WINDOW,
                                        bundle=True)))
        logs = m.decode_server_message(await ws.recv())
        if not isinstance(logs, m.FailoverLogs):
            raise RuntimeError(f"expected failover_logs, got {logs!r}")
        for p, info in logs.partitions.items():
            seq = 0 if start == "beginning" else info.high_seqno
            uuid = info.log[0].uuid if info.log else 0
            await ws.send(m.encode(m.StreamRequest(partition=p, uuid=uuid, start_seqno=seq, snap_start=seq,
                                                   snap_end=seq)))
        waiting = set(logs.partitions)
        unacked = 0
        early: list[bytes | str] = []

        def control(text: str) -> None:
            msg = m.decode_server_message(text)
            if isinstance(msg, m.StreamResponse):
                if msg.status != m.StreamStatus.OK:
                    raise RuntimeError(f"stream_request for partition {msg.partition}: {msg.status} {msg.detail}")
                waiting.discard(msg.partition)
            elif isinstance(msg, m.Error):
                raise RuntimeError(f"server error {msg.code}: {msg.message}")

        def values(frame: bytes) -> list[bytes | str]:
            if frame[:4] == BUNDLE_MAGIC:  # a pass's markers and batches in one message (hello bundle=True)
                out: list[bytes | str] = []
                view = memoryview(frame)
                for kind, a, b in bundle_spans(frame):
                    if kind == PART_BINARY:
                        out += live_values(view[a:b])
                    elif not frame.startswith(_ROUTINE, a, a + _ROUTINE_LEN):
                        control(frame[a:b].decode())
                return out
            return live_values(frame)  # type: ignore[return-value]

        while waiting:
            frame = await ws.recv()
            unacked += len(frame)
            if isinstance(frame, str):
                control(frame)
            else:
                early += values(frame)
        yield []
        if early:
            yield early
        while True:
            frame = await ws.recv()
            unacked += len(frame)
            if isinstance(frame, str):
                control(frame)
            else:
                yield values(frame)
            if unacked >= WINDOW // 2:
                await ws.send(m.encode(m.Ack(bytes=unacked)))
                unacked = 0
