"""One server per test module for the HTTP tests (starting one takes ~0.5 s)."""
from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from app.auth import TokenTable
from app.main import create_app
from app.settings import Settings
from tests.conftest import ServerProcess, start_server

PARTITIONS = 8
TOKENS = {"reader-token-0001": "read", "writer-token-0001": "write", "admin-token-00001": "admin"}


def key_in(partition: int, prefix: str = "k", partitions: int = PARTITIONS) -> str:
    """A key that hashes to ``partition`` (crc32 % partitions, the documented hash)."""
    for i in range(100_000):
        key = f"{prefix}{i}"
        if zlib.crc32(key.encode()) % partitions == partition:
            return key
    raise AssertionError("no key found")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("upr"), partitions=PARTITIONS)
    yield srv
    srv.kill()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


@pytest.fixture
async def inproc(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app in this process over a real engine (protected mode, loopback caller): for route
    logic that needs no server process.  The lifespan runs as under uvicorn."""
    app = create_app(Settings(data_dir=tmp_path / "data", partitions=PARTITIONS), tokens=TokenTable())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            yield c
