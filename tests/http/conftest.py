"""One server per test module for the HTTP tests (starting one takes ~0.5 s), and the app
in-process for route logic that needs no server process."""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.asgi import in_process_app
from tests.support.keys import PARTITIONS
from tests.support.server import ServerProcess, start_server


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
    """The app in this process over a real engine (tokenless mode, loopback caller)."""
    async with in_process_app(tmp_path / "data", partitions=PARTITIONS) as running:
        yield running.client
