"""One WebSocket to the server's ``/stream``: opening it, and moving messages in and out.

Bytes only: what the messages mean is ``engine.protocol.client.session``'s business.  Received
messages come out decoded, bundles split into their parts, each with the bytes flow control
counts for it (``engine.protocol.client.incoming``).
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from engine.protocol import messages as M
from engine.protocol.bundle import encode_bundle
from engine.protocol.client.incoming import PackedPass, decode_frame, frame_bytes, is_bundle, split_bundle, unpacked

from .errors import AuthFailed, ConnectionFailed, ProtocolViolation, UsageError

__all__ = ["ReconnectNeeded", "StreamConnection", "stream_url"]

#: Close codes by which the server says the client broke the protocol: retrying would not help.
_PROTOCOL_CLOSE_CODES = {1003, 1008, 1009}


class ReconnectNeeded(Exception):
    """Drop this connection and handshake again (after a backoff); never leaves the consumer."""


def stream_url(server: str) -> str:
    base = server.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://"):] + "/stream"
    if base.startswith("http://"):
        return "ws://" + base[len("http://"):] + "/stream"
    if base.startswith(("ws://", "wss://")):
        return base if base.endswith("/stream") else base + "/stream"
    raise UsageError(f"server URL must start with http:// or https://, got {server!r}", field="server")


class StreamConnection:
    """An open stream WebSocket; ``receive`` returns one server message at a time."""

    def __init__(self, ws: ClientConnection, *, unpack: bool = True) -> None:
        self.ws = ws
        #: the rest of a bundle being processed: (message, bytes it accounts for)
        self._parts: deque[tuple[str | bytes, int]] = deque()
        #: a packed pass comes out as the markers and batches it stands for (``unpack``), or
        #: whole (a ``PackedPass``, for a reader that processes the pass at once)
        self.unpack = unpack
        #: the rest of a packed pass, decoded: (message, bytes it accounts for)
        self._unpacked: deque[tuple[Any, int]] = deque()
        #: True while waiting for the next message (a seek from another task must wake it)
        self.reading = False

    @classmethod
    async def open(cls, url: str, token: str | None, *, open_timeout: float, max_frame_bytes: int,
                   ping_interval: float | None, unpack: bool = True) -> "StreamConnection":
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            ws = await connect(url, additional_headers=headers, open_timeout=open_timeout,
                               max_size=max_frame_bytes, ping_interval=ping_interval,
                               ping_timeout=ping_interval, compression=None)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise AuthFailed(f"{url}: HTTP {status}: the token is missing, unknown or lacks the read role",
                                 field="token") from None
            raise ConnectionFailed(f"{url}: WebSocket upgrade refused with HTTP {status}") from None
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
            raise ConnectionFailed(f"cannot reach {url}: {exc or type(exc).__name__}") from None
        return cls(ws, unpack=unpack)

    async def first(self, timeout: float) -> tuple[Any, int]:
        """The answer to ``hello`` (never bundled)."""
        async with asyncio.timeout(timeout):
            frame = await self.ws.recv()
        return (decode_frame(frame) if isinstance(frame, str) else frame), frame_bytes(frame)

    async def receive(self) -> tuple[Any, int]:
        """The next server message and the bytes it accounts for."""
        if self._unpacked:
            return self._unpacked.popleft()
        if self._parts:
            frame, nbytes = self._parts.popleft()
        else:
            self.reading = True
            try:
                frame = await self.ws.recv()
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code in _PROTOCOL_CLOSE_CODES:
                    raise ProtocolViolation(f"server closed the stream with code {code}: "
                                            f"{exc.rcvd.reason if exc.rcvd else ''}") from None
                raise ReconnectNeeded(f"connection closed ({code})") from None
            finally:
                self.reading = False
            nbytes = frame_bytes(frame)
            if is_bundle(frame):
                self._parts.extend(split_bundle(frame, nbytes))  # type: ignore[arg-type]
                frame, nbytes = self._parts.popleft()
        return self._decoded(frame, nbytes)

    def _decoded(self, frame: str | bytes, nbytes: int) -> tuple[Any, int]:
        msg = decode_frame(frame)
        if self.unpack and type(msg) is PackedPass:
            self._unpacked.extend(unpacked(msg, nbytes))
            return self._unpacked.popleft()
        return msg, nbytes

    def receive_buffered(self) -> tuple[Any, int] | None:
        """The next message of the bundle being read, if one is left: no waiting.

        WHY: a caller that hands work to a thread per message can gather what already arrived
        and pay for one hop instead of one per message."""
        if self._unpacked:
            return self._unpacked.popleft()
        if not self._parts:
            return None
        frame, nbytes = self._parts.popleft()
        return self._decoded(frame, nbytes)

    async def send(self, msg: Any) -> None:
        await self.ws.send(M.encode(msg))

    async def send_bundled(self, msgs: list[Any]) -> None:
        """Send ``msgs`` in order as one bundle (one WebSocket message), or the only one as
        itself.  Only after hello ``bundle: true``, which a server answers by taking client
        bundles of text messages too (``ServerSession.receive_binary``)."""
        if len(msgs) == 1:
            await self.ws.send(M.encode(msgs[0]))
        elif msgs:
            await self.ws.send(encode_bundle([M.encode(m) for m in msgs]))

    async def send_quiet(self, msg: Any) -> None:
        """Send, ignoring a closed connection: the next receive notices it and reconnects."""
        try:
            await self.ws.send(M.encode(msg))
        except ConnectionClosed:
            pass

    async def close(self) -> None:
        await self.ws.close()
