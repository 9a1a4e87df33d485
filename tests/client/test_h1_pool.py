"""``clients.h1_pool`` and ``AsyncHttpApi`` over it, against scripted servers on loopback: the
connection kept and reused, given up when the server says so or when it sat idle too long, and
every failure the typed error of the httpx path (nothing sent / maybe applied)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import orjson
import pytest

from clients.errors import AuthFailed, ConnectionFailed, HttpError
from clients.h1_pool import ConnectFailed, ExchangeFailed, H1Pool
from clients.http import AsyncHttpApi

Answer = Callable[[bytes], bytes | None]  # the request's head and body -> the bytes to send back (None: say nothing)


def answer(status: int, body: object = None, *, close: bool = False) -> bytes:
    data = b"" if body is None else orjson.dumps(body)
    reason = {200: "OK", 401: "Unauthorized", 421: "Misdirected Request", 500: "Internal Server Error"}.get(status, "X")
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + data


class Scripted:
    """A server answering each request with ``respond(request bytes)``; counts connections and requests."""

    def __init__(self, respond: Answer) -> None:
        self.respond = respond
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                out = self.respond(head + body)
                if out is None:
                    await asyncio.sleep(3600)
                writer.write(out)
                await writer.drain()
                if b"Connection: close" in out or out.endswith(b"cut"):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def scripted(respond: Answer) -> AsyncIterator[Scripted]:
    server = Scripted(respond)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        srv.close()


async def test_one_connection_carries_request_after_request() -> None:
    async with scripted(lambda req: answer(200, {"n": len(req)})) as srv:
        pool = H1Pool(timeout=5)
        for _ in range(5):
            resp = await pool.request(srv.url, "POST", "/docs/_bulk?a=1", [("Content-Type", "application/json")], b"[]")
            assert resp.status_code == 200 and resp.json()["n"] > 0
        assert (srv.connections, pool.connects, len(srv.requests)) == (1, 1, 5)
        assert srv.requests[0].startswith(b"POST /docs/_bulk?a=1 HTTP/1.1\r\n")
        await pool.aclose()


async def test_a_closing_answer_or_a_long_idle_opens_a_new_connection() -> None:
    async with scripted(lambda req: answer(200, {}, close=b"/close" in req)) as srv:
        pool = H1Pool(timeout=5, idle_s=0.2)
        await pool.request(srv.url, "GET", "/close")
        await pool.request(srv.url, "GET", "/a")
        assert pool.connects == 2
        await pool.request(srv.url, "GET", "/a")
        assert pool.connects == 2
        await asyncio.sleep(0.3)  # past idle_s: the server might be closing it, so it is not reused
        await pool.request(srv.url, "GET", "/a")
        assert pool.connects == 3
        await pool.aclose()


async def test_failures_tell_nothing_sent_from_maybe_applied() -> None:
    async with scripted(lambda req: None if b"/mute" in req else b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ncut") as srv:
        pool = H1Pool(timeout=0.5)
        with pytest.raises(ExchangeFailed, match="no answer within"):
            await pool.request(srv.url, "GET", "/mute")
        with pytest.raises(ExchangeFailed):  # the body cut short by the server closing
            await pool.request(srv.url, "GET", "/cut")
    with pytest.raises(ConnectFailed):
        await H1Pool(timeout=2).request(srv.url, "GET", "/")  # the server is gone
    with pytest.raises(ValueError, match="http://"):
        await H1Pool().request("https://127.0.0.1:1", "GET", "/")


async def test_the_async_api_follows_a_421_sends_the_token_and_types_its_errors() -> None:
    async with scripted(lambda req: answer(200, {"succeeded": 1, "failed": 0, "auth": b"Bearer tok" in req})) as b:
        async with scripted(lambda req: answer(421, {"type": "https://upr.dev/problems/misdirected-request",
                                                     "status": 421, "url": b.url})) as a:
            api = AsyncHttpApi(a.url, "tok", timeout=5)
            out = await api.bulk([{"op": "set", "key": "k", "value": 1}], durability="memory", columns=True)
            assert out == {"succeeded": 1, "failed": 0, "auth": True}
            assert a.requests[0].startswith(b"POST /docs/_bulk?durability=memory&results=columns HTTP/1.1")
            assert b'[{"op":"set","key":"k","value":1}]' in b.requests[0]
            await api.aclose()
    async with scripted(lambda req: answer(401, {"detail": "no"}) if b"/docs/_bulk" in req
                        else answer(500, {"detail": "boom", "type": "x/internal"})) as srv:
        api = AsyncHttpApi(srv.url, timeout=5)
        with pytest.raises(AuthFailed):
            await api.bulk([])
        with pytest.raises(HttpError) as info:
            await api.status()
        assert info.value.status == 500 and "boom" in str(info.value)
        await api.aclose()
    refused = srv.url  # closed now
    async with scripted(lambda req: answer(200, {"ok": 1})) as srv:
        api = AsyncHttpApi(f"{refused},{srv.url}", timeout=5)  # the first refuses: the next is asked
        assert await api.status() == {"ok": 1}
        await api.aclose()
    api = AsyncHttpApi(refused, timeout=5)
    with pytest.raises(ConnectionFailed, match="cannot reach"):
        await api.bulk([])
    await api.aclose()
