"""Every endpoint reads its body under a limit, enforced while the body streams in: the JSON
routes FastAPI parses (positions check, admin) included, not only the document and bulk routes."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import orjson
import psutil
import pytest

from app.auth import TokenTable
from app.main import create_app
from app.settings import Settings
from tests.support.server import ServerProcess, start_server
from tests.support.problems import problem

LIMIT = 2048
MiB = 1 << 20

#: (method, path, a valid JSON body) of every route whose body FastAPI parses
JSON_ROUTES = [
    ("POST", "/positions/check", {"positions": []}),
    ("POST", "/admin/compact", {"older_than_s": 1e9}),
    ("POST", "/admin/partitions/0/state", {"state": "active"}),
]


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(data_dir=tmp_path / "data", partitions=2, max_request_bytes=LIMIT, max_value_bytes=3 * LIMIT)
    app = create_app(settings, tokens=TokenTable())
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            yield c


def _padded(body: dict, size: int) -> bytes:
    """``body`` as JSON of exactly ``size`` bytes (trailing whitespace is valid JSON)."""
    text = orjson.dumps(body)
    return text + b" " * (size - len(text))


@pytest.mark.parametrize("method, path, body", JSON_ROUTES)
async def test_json_routes_take_a_body_at_the_limit(small: httpx.AsyncClient, method: str, path: str,
                                                    body: dict) -> None:
    r = await small.request(method, path, content=_padded(body, LIMIT), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("method, path, body", JSON_ROUTES)
async def test_json_routes_refuse_a_declared_length_over_the_limit(small: httpx.AsyncClient, method: str, path: str,
                                                                   body: dict) -> None:
    r = await small.request(method, path, content=_padded(body, LIMIT + 1),
                            headers={"content-type": "application/json"})
    assert problem(r, 413, "too-large")["limit"] == LIMIT


@pytest.mark.parametrize("method, path, body", JSON_ROUTES)
async def test_json_routes_refuse_a_streamed_body_once_over_the_limit(small: httpx.AsyncClient, method: str,
                                                                      path: str, body: dict) -> None:
    """No Content-Length (chunked): refused once past the limit, long before the client is done."""
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        yield orjson.dumps(body)[:-1]
        while sent < 100 * LIMIT:
            sent += 512
            yield b" " * 512

    r = await small.request(method, path, content=endless(), headers={"content-type": "application/json"})
    assert problem(r, 413, "too-large")["limit"] == LIMIT
    assert sent < 2 * LIMIT


async def test_routes_with_their_own_limit_keep_it(small: httpx.AsyncClient) -> None:
    """A document value may be larger than the general limit (its own limit applies)."""
    assert (await small.put("/docs/big", content=b"v" * (3 * LIMIT))).status_code == 200
    assert problem(await small.put("/docs/big", content=b"v" * (3 * LIMIT + 1)), 413, "too-large")["limit"] == 3 * LIMIT


# ------------------------------------------------------------------ a real server under a large body
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("upr-body"), partitions=2)  # default limits
    yield srv
    srv.kill()


def _stream_chunked(srv: ServerProcess, path: str, total: int) -> tuple[bytes, int]:
    """Send a chunked body of up to ``total`` bytes (never finished); (the answer's head, bytes sent)."""
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    sent = 0
    chunk = b"%x\r\n%s\r\n" % (MiB, b" " * MiB)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        sock.sendall(b"1\r\n[\r\n")
        try:
            while sent < total:
                sock.sendall(chunk)
                sent += MiB
        except OSError:  # the server answered and closed, or stopped reading (timeout)
            pass
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        except OSError:
            pass
        return answer, sent


class _PeakRss:
    """The server's peak RSS while a block runs, sampled by a thread."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self.start = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> "_PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/positions/check", "/admin/compact"])
def test_a_huge_streamed_body_leaves_the_server_rss_bounded(server: ServerProcess, path: str) -> None:
    """256 MiB streamed at a JSON route: refused at the 8 MiB default, and the server's memory
    grows by far less than the body (it grew by the body's size several times over before)."""
    default = Settings.model_fields["max_request_bytes"].default
    with _PeakRss(server.pid) as rss:
        answer, sent = _stream_chunked(server, path, 256 * MiB)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"application/problem+json" in answer
    assert sent < 256 * MiB  # refused before the client was done
    assert rss.peak - rss.start < 4 * default + 32 * MiB, (rss.start, rss.peak)
    assert httpx.get(server.url + "/health").status_code == 200
