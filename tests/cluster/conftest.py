from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.etcd_server import EtcdProcess, start_etcd


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    server = start_etcd(tmp_path)
    try:
        yield server
    finally:
        server.stop()
