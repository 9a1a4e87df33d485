"""The bare server stack (FastAPI on uvicorn with uvloop/httptools, as upr runs) sending frames.

``GET /frames?size=S&count=N`` upgrades and sends N binary frames of S bytes as fast as the stack
allows, then closes: the ceiling any WebSocket feed served by this stack can reach here.
"""

from __future__ import annotations

from fastapi import FastAPI, WebSocket

app = FastAPI()


@app.websocket("/frames")
async def frames(ws: WebSocket, size: int = 1024, count: int = 1000) -> None:
    await ws.accept()
    payload = b"x" * min(size, 1 << 24)
    for _ in range(min(count, 10_000_000)):
        await ws.send_bytes(payload)
    await ws.close()
