"""Server CPU per WebSocket message: through Starlette/ASGI against framed and written directly.

    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_rawframes                 # 20,000 messages a mode
    PYTHONPATH=$PWD .venv/bin/python -m bench.bench_rawframes --messages 50000 --shared-bytes 8192

A real uvicorn (uvloop, httptools, its sans-I/O WebSocket protocol, no compression: as upr runs
it) in this process serves a Starlette WebSocket route; a ``websockets`` client in another process
reads every message.  Each message is laid out as a shared pass's bundle is: a 16-byte header,
``--shared-bytes`` of parts the same object for every message (a shared reading) and a short
per-connection tail (a ``cycle_complete``).  Modes:

* ``asgi``: ``b"".join`` of the parts, then ``WebSocket.send_bytes`` (Starlette -> uvicorn ->
  ``websockets`` framing -> ``transport.write``), what the stream server did;
* ``raw``: ``RawFrames.write_parts`` (``app.stream.rawframes``): the frame header and the parts
  handed to ``transport.writelines``, nothing copied per message.

Printed per mode: the server process's CPU µs per message (``time.process_time``, so what the
machine's other load does to wall time does not enter), and messages per second (wall: load-dependent).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from app.stream.rawframes import RawFrames, RawSendScope
from engine.protocol.bundle import BUNDLE, encode_parts

_CLIENT = r"""
import asyncio, sys, websockets
async def main(url, n):
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        got = 0
        while got < n:
            await ws.recv()
            got += 1
        await ws.send("done")
        await ws.recv()
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _parts(shared_bytes: int) -> tuple[bytes, bytes]:
    shared = encode_parts([b"x" * max(0, shared_bytes - 8)])
    return BUNDLE.pack_header(0, 0, 2), shared


async def _run(mode: str, messages: int, shared_bytes: int) -> dict[str, Any]:
    header, shared = _parts(shared_bytes)
    result: dict[str, Any] = {}

    async def route(ws: WebSocket) -> None:
        await ws.accept()
        raw = RawFrames.of(ws.scope)
        if mode == "raw" and raw is None:
            raise SystemExit("uvicorn's sans-I/O WebSocket protocol not found: no direct writes possible")
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(messages):
            tail = encode_parts([f'{{"type":"cycle_complete","cycle":{i}}}'])
            parts = [header, shared, tail]
            if mode == "raw" and raw is not None and raw.ready():
                raw.write_parts(parts, sum(map(len, parts)))
            else:
                await ws.send_bytes(b"".join(parts))
            if i % 64 == 63:
                await asyncio.sleep(0)  # let the loop run its socket callbacks, as a server's passes do
        await ws.receive_text()  # the client got them all
        result.update(cpu_s=time.process_time() - cpu0, wall_s=time.perf_counter() - t0)
        await ws.send_text("bye")

    app = RawSendScope(Starlette(routes=[WebSocketRoute("/", route)]))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, loop="none", http="httptools", ws="websockets-sansio",
                                           ws_per_message_deflate=False, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    client = subprocess.Popen([sys.executable, "-c", _CLIENT, f"ws://127.0.0.1:{port}/", str(messages)])
    try:
        while client.poll() is None:
            await asyncio.sleep(0.05)
    finally:
        server.should_exit = True
        await serving
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--shared-bytes", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2, help="each mode this many times, alternating")
    args = ap.parse_args()
    import uvloop

    rows = []
    for r in range(args.rounds):
        for mode in ("asgi", "raw"):
            res = uvloop.run(_run(mode, args.messages, args.shared_bytes))
            rows.append({"round": r + 1, "mode": mode, "cpu_us_per_message": 1e6 * res["cpu_s"] / args.messages,
                         "messages_per_s": args.messages / res["wall_s"]})
            print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
