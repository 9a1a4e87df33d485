"""One server per test module for the HTTP tests (starting one takes ~0.5 s)."""
from __future__ import annotations

import zlib
from collections.abc import Iterator

import httpx
import pytest

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
