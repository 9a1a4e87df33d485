"""A real standalone Spark cluster on 127.0.0.1: master + one worker from the installed pyspark.

The executors run an environment built from this project's wheel (``upr index env``), not the
driver's venv; the driver runs ``upr index run --spark-master spark://...`` and a streaming
query with the ``upr`` source against it, then a second application whose executors get the same
environment packed as an archive through ``spark.archives`` (tests/spark/standalone_driver.py,
one JVM).

The environment is cached under ``.venv/cache/`` keyed by a hash of the wheel's sources, so only
the first run after a code change builds it (pip wheel + venv: ~20 s).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.spark_standalone import standalone_cluster
from spark_connector.executor_env import WHEEL_SOURCES, build_env, build_wheel, pack
from spark_connector.index.lookup import lookup
from tests.spark.helpers import CITIES, brute_force, bulk, random_ops

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(__import__("pyspark").__file__).parent
KEYS = [f"doc-{i:05d}" for i in range(400)]


def _sources_hash() -> str:
    digest = hashlib.sha256()
    for name in WHEEL_SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()
                                                      and "__pycache__" not in p.parts)
        for f in files:
            digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def executor_env(tmp_path_factory) -> Path:
    cache = ROOT / ".venv" / "cache" / "spark-executor-env"
    env = cache / _sources_hash()
    if not (env / "bin" / "python").exists():
        cache.mkdir(parents=True, exist_ok=True)
        for old in cache.iterdir():
            shutil.rmtree(old, ignore_errors=True)
        staging = cache / f".build-{os.getpid()}"
        wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
        build_env(staging, wheel, deps="inherit")
        # a venv's scripts name its path, but bin/python (all Spark runs) does not: renaming is safe
        os.replace(staging, env)
        # building the env must leave the driver's venv and its own upr install untouched
        probe = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('upr'))"],
                               cwd="/", env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                               capture_output=True, text=True)
        assert probe.returncode == 0 and probe.stdout.strip(), probe.stderr
    return env


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a master with one registered worker (ephemeral ports); the
    daemons get no PYTHONPATH, so executors cannot import the project from the tests' tree
    instead of the shipped environment."""
    with standalone_cluster(tmp_path_factory.mktemp("standalone"), cores=2, memory="2g") as url:
        yield url


@pytest.mark.timeout(900)
def test_index_build_and_streaming_query_on_a_standalone_cluster_with_a_shipped_env(
        upr_server, tmp_path, executor_env, standalone):
    srv = upr_server(partitions=4)
    live: set[str] = set()
    bulk(srv.url, random_ops(random.Random(4), KEYS, live, 800))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_") and k != "UPR_SPARK_PYTHON"}
    env["PYTHONPATH"] = str(ROOT)
    archive = pack(executor_env, tmp_path / "upr-env.tar.gz")       # `upr index env --pack`
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "spark" / "standalone_driver.py"), standalone, str(executor_env),
         srv.url, str(tmp_path / "idx"), str(tmp_path / "ckpt"), str(archive)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["generation"] >= 1, done.stderr[-4000:]
    expected = brute_force(srv.url, KEYS)
    found = {(city, e["key"], e["partition"], e["seqno"]) for city in CITIES for e in lookup(tmp_path / "idx", city)}
    assert found == expected            # every value random_ops writes is one of CITIES
    assert result["rows"] >= len(live)
    # every task ran the shipped environment's interpreter and imported the connector from it
    assert result["executors"], "no executor reported"
    for python, module in result["executors"]:
        assert python == str(executor_env / "bin" / "python"), python
        assert module.startswith(str(executor_env)), module
    # the archive form: Spark unpacked it in the executor's work dir and ran its interpreter
    assert result["archive_rows"] >= len(live) and result["archive_executors"], result
    for python, module in result["archive_executors"]:
        unpacked = os.path.normpath(python).removesuffix("/bin/python")
        assert python.endswith("upr_env/bin/python"), python
        assert not python.startswith(str(executor_env)) and os.path.normpath(module).startswith(unpacked), \
            (python, module)
