"""Writing a stream's WebSocket messages straight to the transport, framed here.

Theory of operation
-------------------
A message sent through Starlette goes ``WebSocket.send_bytes`` -> the ASGI ``send`` of each
middleware -> uvicorn's ``WebSocketsSansIOProtocol.send`` -> ``websockets`` framing (the payload
copied into the frame, then the frame copied again by ``b"".join``) -> ``transport.write``.  A
server's frame is only a short header before the payload (``engine.protocol.wsframe``), so the
stream server writes ``[header, *payload parts]`` with one ``transport.writelines``: the parts of
a shared pass (the same ``bytes`` objects for every connection at that position) reach the
socket without being copied per connection, and the per-connection work of a send is the header
and the write.

``RawSendScope`` (an ASGI middleware, outermost) puts the server's own ``send`` into a WebSocket
scope; ``RawFrames.of`` recognises uvicorn's sans-I/O WebSocket protocol behind it and returns
None for anything else (other uvicorn implementations, test clients): the connection then sends
through ASGI as before.  ``ready`` says when a direct write is as the ASGI path would make it:
the handshake done, no close sent or received, no extension negotiated, and the transport
accepting writes (uvicorn's flow control: while it is paused the caller takes the ASGI path,
which waits for the transport to drain).  Ordering with uvicorn's own writes (pongs, pings,
the close frame) holds: both write to the same transport synchronously on the event loop, and
uvicorn drains its protocol's output after every action, so nothing of it is pending meanwhile.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.protocol.wsframe import OP_BINARY, OP_TEXT, frame_header

__all__ = ["RAW_SEND_KEY", "RawFrames", "RawSendScope"]

#: the scope key under which ``RawSendScope`` leaves the server's ``send``
RAW_SEND_KEY = "upr.server_send"


class RawSendScope:
    """ASGI middleware: a WebSocket scope carries the server's own ``send`` (for ``RawFrames``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            scope[RAW_SEND_KEY] = send
        await self.app(scope, receive, send)


class RawFrames:
    """Direct frame writes to one uvicorn WebSocket connection's transport."""

    __slots__ = ("_proto", "_open", "messages")

    def __init__(self, proto: Any) -> None:
        self._proto = proto
        from websockets.protocol import OPEN  # the library uvicorn's protocol is built on
        self._open = OPEN
        self.messages = 0  # messages written directly (for benchmarks and tests)

    @classmethod
    def of(cls, scope: Any) -> "RawFrames | None":
        """The direct writer of the connection ``scope`` belongs to, or None (send through ASGI)."""
        send = scope.get(RAW_SEND_KEY) if hasattr(scope, "get") else None
        proto = getattr(send, "__self__", None)
        if proto is None or type(proto).__name__ != "WebSocketsSansIOProtocol":
            return None
        if not all(hasattr(proto, a) for a in ("transport", "conn", "writable", "close_sent", "disconnected")):
            return None
        try:
            return cls(proto)
        except ImportError:
            return None

    def ready(self) -> bool:
        """Whether a message may be written directly now (else: send it through ASGI)."""
        proto = self._proto
        conn = proto.conn
        return (proto.handshake_complete and not proto.close_sent and not proto.disconnected
                and proto.writable.is_set() and conn.state is self._open and not conn.extensions
                and not conn.expect_continuation_frame and not proto.transport.is_closing())

    def write(self, data: str | bytes) -> None:
        """One message (text: pure ASCII, as the stream server's text messages are)."""
        if isinstance(data, str):
            payload = data.encode()
            self._proto.transport.writelines((frame_header(OP_TEXT, len(payload)), payload))
        else:
            self._proto.transport.writelines((frame_header(OP_BINARY, len(data)), data))
        self.messages += 1

    def write_parts(self, parts: Sequence[bytes], length: int) -> None:
        """One binary message made of ``parts`` (``length`` bytes in all), none of them copied here."""
        self._proto.transport.writelines((frame_header(OP_BINARY, length), *parts))
        self.messages += 1
