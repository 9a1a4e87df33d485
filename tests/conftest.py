"""Fixtures shared by every test package (the helpers they use live in ``tests/support``).

``upr_server``: start real ``upr server`` processes on 127.0.0.1 with an ephemeral port::

    def test_x(upr_server):
        srv = upr_server(partitions=8)                 # data dir under tmp_path
        httpx.get(f"{srv.url}/health")
        srv.kill()                                     # SIGKILL
        srv2 = upr_server(data_dir=srv.data_dir)       # restart on the same data

Options are ``tests.support.server.start_server``'s.  Every process started is killed at teardown.

``asgi_client``: the app in-process over ``httpx.ASGITransport`` (``tests.support.asgi``), for
route logic that needs no socket and no subprocess.
"""
from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.asgi import InProcessApp, in_process_app
from tests.support.server import ServerProcess, start_server

#: Every JVM the tests start (Spark drivers, also inside ``upr index`` subprocesses, and standalone
#: daemons) lives seconds to minutes: with the C1 compiler alone and the serial collector it spends
#: about a third less CPU than with the server defaults (docs/testing.md, "Suite time").
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", SHORT_LIVED_JVM)


#: The longest files, by the suite's measured durations (docs/testing.md, "Suite time"): an
#: ordering hint only; a file missing here still runs, among the other slow ones.
LONGEST_FILES = (
    "tests/spark/test_standalone_cluster.py", "tests/spark/test_cli_run.py", "tests/spark/test_index_e2e.py",
    "tests/cluster/test_majority_failover.py", "tests/backup/test_backup_live.py",
    "tests/cluster/test_consumer_follows_map.py", "tests/cluster/test_backup_cluster_and_consumer_api.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first, then the other slow ones, then the rest, each file kept whole.

    ``make test`` passes ``--no-loadscope-reorder``, so pytest-xdist hands whole files to its two
    workers in this order (by default it would start with the files holding the most tests, the
    quick table-driven ones, and leave a long end-to-end file for one worker at the end while the
    other idles).  Longest first and the many short files last keeps both workers busy to the end.
    """
    root = config.rootpath
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path)
        if name in LONGEST_FILES:
            return 0, LONGEST_FILES.index(name)
        return (1 if item.path in slow else 2), 0

    items.sort(key=rank)  # stable: each file's tests stay together and in their order


@pytest.fixture
def upr_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(**kwargs: object) -> ServerProcess:
        server = start_server(tmp_path / "upr", **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
async def asgi_app(tmp_path: Path) -> AsyncIterator[InProcessApp]:
    """A fresh app on its own data dir (8 partitions, no tokens), lifespan run in-process."""
    async with in_process_app(tmp_path / "data") as app:
        yield app


@pytest.fixture
async def asgi_client(asgi_app: InProcessApp) -> AsyncIterator[httpx.AsyncClient]:
    yield asgi_app.client
