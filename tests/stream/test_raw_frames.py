"""Frames written straight to the transport: the same bytes the WebSocket library would send."""
from __future__ import annotations

import asyncio
import socket

import pytest
import uvicorn
import websockets
from websockets.frames import Frame, Opcode

from app.stream.rawframes import RawFrames, RawSendScope
from engine.protocol.wsframe import OP_BINARY, OP_TEXT, frame_header


@pytest.mark.parametrize("length", [0, 1, 125, 126, 127, 65535, 65536, 70000])
@pytest.mark.parametrize("ours,theirs", [(OP_BINARY, Opcode.BINARY), (OP_TEXT, Opcode.TEXT)])
def test_header_is_what_websockets_frames(length: int, ours: int, theirs: object) -> None:
    payload = b"x" * length
    expected = Frame(theirs, payload).serialize(mask=False)  # type: ignore[arg-type]
    assert frame_header(ours, length) + payload == expected


@pytest.mark.parametrize("opcode,length", [(0x8, 1), (OP_BINARY, -1)])
def test_header_refuses_what_it_does_not_frame(opcode: int, length: int) -> None:
    with pytest.raises(ValueError):
        frame_header(opcode, length)


def _serve_and_receive(app: object, count: int, deflate: bool) -> list[object]:
    async def main() -> list[object]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(RawSendScope(app), ws="websockets-sansio", log_level="warning", lifespan="off",
                                ws_per_message_deflate=deflate)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            for _ in range(200):
                if server.started:
                    break
                await asyncio.sleep(0.05)
            async with websockets.connect(f"ws://127.0.0.1:{port}/", max_size=None) as ws:
                return [await asyncio.wait_for(ws.recv(), 20) for _ in range(count)]
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 20)

    return asyncio.run(main())


def test_direct_writes_reach_a_websockets_client_under_uvicorn() -> None:
    """A real uvicorn (its sans-I/O WebSocket protocol, no compression, as the server runs it):
    the messages written directly, a text, a binary, and one made of parts, arrive whole and in
    order among ASGI-sent ones."""
    found: list[bool] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "websocket":
            return
        await receive()  # connect
        await send({"type": "websocket.accept"})
        raw = RawFrames.of(scope)
        found.append(raw is not None)
        assert raw is not None and raw.ready()
        await send({"type": "websocket.send", "text": "via asgi"})
        raw.write("direct text")
        raw.write(b"\x00" * 70000)
        raw.write_parts([b"ab", b"c" * 200, b""], 202)
        await send({"type": "websocket.send", "bytes": b"asgi again"})
        await receive()  # the client's close

    got = _serve_and_receive(app, 5, deflate=False)
    assert found == [True]
    assert got == ["via asgi", "direct text", b"\x00" * 70000, b"ab" + b"c" * 200, b"asgi again"]


def test_a_negotiated_extension_takes_the_asgi_path() -> None:
    """Compression changes the payload: with permessage-deflate negotiated nothing is written directly."""
    ready: list[bool] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        raw = RawFrames.of(scope)
        ready.append(raw is not None and raw.ready())
        await send({"type": "websocket.send", "text": "compressed"})
        await receive()

    assert _serve_and_receive(app, 1, deflate=True) == ["compressed"]
    assert ready == [False]


def test_anything_but_uvicorns_protocol_takes_the_asgi_path() -> None:
    async def send(message: object) -> None:
        pass

    assert RawFrames.of({"upr.server_send": send}) is None
    assert RawFrames.of({}) is None
