"""Keep-alive HTTP/1.1 connections on asyncio: the lean transport of ``clients.http.AsyncHttpApi``.

One request at a time per connection (no pipelining), idle connections kept per origin and
reused.  Each connection is an ``asyncio.Protocol`` that feeds ``clients.h1.ResponseParser``
and settles one future per request: per request that is one transport write and one wake-up,
with no stream reader, no task and no event objects in between (why at all: ``clients.h1``).

Failures are two exceptions, so a caller can tell "nothing was sent" from "maybe applied":
``ConnectFailed`` (no connection could be made: another server may be tried) and
``ExchangeFailed`` (the connection failed, the answer was malformed, or the timeout passed
after the request was written: the request may have been applied).

A connection idle longer than ``idle_s`` is not reused but closed: a server closes idle
keep-alive connections after its own timeout (uvicorn's default is 5 s), and a request written
into a connection the server is closing is lost without a way to know whether it was read.
Below that age the server does not close, so a request is never sent twice.  Only ``http://``.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

from .h1 import ProtocolError, Response, ResponseParser, format_request

__all__ = ["ConnectFailed", "ExchangeFailed", "H1Pool"]

#: reuse an idle connection only below this age (under uvicorn's 5 s keep-alive timeout)
IDLE_S = 3.0
#: idle connections kept per origin (concurrent callers each hold one while they wait)
MAX_IDLE = 16


class ConnectFailed(OSError):
    """No connection could be made: nothing was sent."""


class ExchangeFailed(OSError):
    """The request was (perhaps) sent, but no complete answer came back."""


class _Connection(asyncio.Protocol):
    """One TCP connection and its parser; ``exchange`` writes a request and awaits its answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = ResponseParser()
        self.waiter: asyncio.Future[Response] | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            answers = self.parser.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if not answers:
            return
        waiter = self.waiter
        if len(answers) > 1 or waiter is None or waiter.done():
            self._fail(ProtocolError("an answer arrived that no request asked for"))
            return
        self.waiter = None
        waiter.set_result(answers[0])

    def eof_received(self) -> bool:
        try:
            answer = self.parser.eof()
        except ProtocolError as exc:
            self._fail(exc)
            return False
        waiter = self.waiter
        if answer is not None and waiter is not None and not waiter.done():
            answer.keep_alive = False
            self.waiter = None
            waiter.set_result(answer)
        self.closed = True
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._settle_error(exc or ConnectionResetError("the server closed the connection"))

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        self._settle_error(exc)
        if self.transport is not None:
            self.transport.abort()

    def _settle_error(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def exchange(self, data: bytes, head: bool) -> Response:
        assert self.transport is not None and self.waiter is None
        waiter: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.waiter = waiter
        self.parser.head_request = head
        self.transport.write(data)
        return await waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class H1Pool:
    """Keep-alive connections per origin (``http://host:port``)."""

    def __init__(self, *, timeout: float = 10.0, idle_s: float = IDLE_S, max_idle: int = MAX_IDLE) -> None:
        self.timeout = timeout
        self.idle_s = idle_s
        self.max_idle = max_idle
        self._idle: dict[str, list[_Connection]] = {}
        self.connects = 0  # connections opened (tests, benchmarks)

    async def request(self, base: str, method: str, target: str, headers: Iterable[tuple[str, str]] = (),
                      body: bytes = b"", *, timeout: float | None = None) -> Response:
        """``method target`` on ``base`` (``http://host:port[/prefix]``); the answer, whatever its
        status.  ``target`` is the path (after the prefix) and query, percent-encoded."""
        parts = urlsplit(base)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the lean transport speaks plain http:// only, not {base!r}")
        host, port = parts.hostname, parts.port or 80
        data = format_request(method, parts.path.rstrip("/") + target, parts.netloc, headers, body)
        limit = self.timeout if timeout is None else timeout
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(limit):
                conn = await self._acquire(base, host, port)
                try:
                    answer = await conn.exchange(data, method == "HEAD")
                except BaseException:
                    conn.close()  # its state is unknown: never reused
                    raise
        except TimeoutError:
            if conn is None:
                raise ConnectFailed(f"no connection within {limit:g} s") from None
            raise ExchangeFailed(f"no answer within {limit:g} s") from None
        except (ProtocolError, OSError) as exc:
            if isinstance(exc, (ConnectFailed, ExchangeFailed)):
                raise
            raise ExchangeFailed(str(exc) or type(exc).__name__) from exc
        self._release(base, conn, answer.keep_alive)
        return answer

    async def _acquire(self, base: str, host: str, port: int) -> _Connection:
        idle = self._idle.get(base)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.idle_s and conn.parser.idle:
                return conn
            conn.close()
        try:
            _transport, conn = await asyncio.get_running_loop().create_connection(_Connection, host, port)
        except OSError as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        self.connects += 1
        return conn

    def _release(self, base: str, conn: _Connection, keep_alive: bool) -> None:
        idle = self._idle.setdefault(base, [])
        if not keep_alive or conn.closed or len(idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
