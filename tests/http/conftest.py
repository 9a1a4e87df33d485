"""One server per test module for the HTTP tests (starting one takes ~0.5 s)."""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

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
