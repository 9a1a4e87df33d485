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
import warnings
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


def _share_the_default_ssl_context() -> None:
    """Every ``httpx.Client`` made with the default ``verify=True`` shares one SSL context.

    ``httpx.get()`` and each new ``Client`` build an SSL context and load the CA bundle into it
    (here ``SSL_CERT_FILE``, ~140 certificates): about 57 ms of CPU, although the tests only speak
    plain HTTP to 127.0.0.1.  Test helpers poll with ``httpx.get`` every 0.1 s, so a test
    process waiting on a cluster spent a third of a core or more parsing certificates, and a check
    of 400 documents one ``httpx.get`` each cost 23 s (docs/testing.md, "Suite time").  The
    context is built from the same arguments each time, so one per argument set is the same
    configuration; only the test processes share it (a server or CLI the tests start builds its
    own, as a user's does).
    """
    import functools

    import httpx._transports.default as transport
    build = getattr(transport, "create_ssl_context", None)
    if build is None or getattr(build, "shared", False):
        return

    @functools.lru_cache(maxsize=8)
    def default(trust_env: bool, cert_file: str | None, cert_dir: str | None):  # type: ignore[no-untyped-def]
        return build(verify=True, trust_env=trust_env)      # reads SSL_CERT_FILE / SSL_CERT_DIR

    def create_ssl_context(verify=True, cert=None, trust_env=True):  # type: ignore[no-untyped-def]
        if verify is True and cert is None:
            return default(trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        return build(verify=verify, cert=cert, trust_env=trust_env)

    create_ssl_context.shared = True  # type: ignore[attr-defined]
    transport.create_ssl_context = create_ssl_context


_share_the_default_ssl_context()


#: The longest files, by the suite's measured durations (docs/testing.md, "Suite time"): an
#: ordering hint only; a file missing here still runs, among the other slow ones.  The first names
#: the unit of the files that share one SparkSession (``SHARED_SPARK_SESSION``), the longest of all.
LONGEST_FILES = (
    "tests/spark/test_index_e2e.py", "tests/spark/test_standalone_cluster.py", "tests/spark/test_cli_run.py",
    "tests/cluster/test_majority_failover.py", "tests/backup/test_backup_live.py",
    "tests/cluster/test_consumer_follows_map.py", "tests/cluster/test_backup_cluster_and_consumer_api.py",
)

#: The files that use the ``spark`` fixture (one local SparkSession per worker process,
#: tests/spark/conftest.py) go to one worker together, so one JVM serves them all: a JVM's start
#: and first queries cost 20-35 s of CPU, and each worker that ran one of them started its own
#: (docs/testing.md, "Suite time").  The Spark files that start JVMs of their own (CLI processes,
#: a standalone cluster) stay units of their own, free to run beside it.
SHARED_SPARK_SESSION = ("tests/spark/", "tests/cluster/test_spark_cluster.py")
OWN_JVMS = ("tests/spark/test_standalone_cluster.py", "tests/spark/test_cli_run.py")
SHARED_SPARK_UNIT = "shared SparkSession"


def work_unit(path: str) -> str:
    """The unit of work ``make test`` hands to one worker for the test file at ``path``."""
    if path.startswith(SHARED_SPARK_SESSION) and path not in OWN_JVMS:
        return SHARED_SPARK_UNIT
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """``--dist loadfile`` with the files of ``SHARED_SPARK_SESSION`` as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedSparkSession(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(super()._split_scope(nodeid))

    return SharedSparkSession(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first, then the other slow ones, then the rest, each file kept whole.

    ``make test`` passes ``--no-loadscope-reorder``, so pytest-xdist hands whole files (and the
    shared SparkSession's unit) to its workers in this order (by default it would start with the
    files holding the most tests, the quick table-driven ones, and leave a long end-to-end file for
    one worker at the end while the others idle).  Longest first and the many short files last
    keeps the workers busy to the end.
    """
    root = config.rootpath

    def name(item: pytest.Item) -> str:
        return item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else str(item.path)

    slow = {item.path for item in items if item.get_closest_marker("slow")}
    outside = sorted({name(item) for item in items
                      if "spark" in getattr(item, "fixturenames", ()) and work_unit(name(item)) != SHARED_SPARK_UNIT})
    if outside:
        warnings.warn(pytest.PytestWarning(
            f"{', '.join(outside)} use the shared SparkSession outside SHARED_SPARK_SESSION (tests/conftest.py): "
            "under `make test` the worker that runs them starts a JVM of its own"), stacklevel=1)

    def rank(item: pytest.Item) -> tuple[int, int]:
        if name(item) in LONGEST_FILES:
            return 0, LONGEST_FILES.index(name(item))
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
