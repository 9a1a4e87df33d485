"""An index at an ``s3://`` URI, for real: a local S3-compatible server (moto's server mode, its
own process on 127.0.0.1), built and updated through Spark local mode, queried by
``upr index query`` in a new process (pyarrow only, no JVM)."""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_connector.index.functions import FieldIndex
from spark_connector.index.job import IndexJob, _same_seqnos
from spark_connector.index.lookup import lookup
from spark_connector.index.manifest import load
from spark_connector.index.storage import open_location
from tests.support.net import free_port
from tests.spark.helpers import CITIES, brute_force, bulk, random_ops

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"doc-{i:05d}" for i in range(300)]


@pytest.fixture
def s3_endpoint(tmp_path):
    """``host:port`` of a fresh S3-compatible server (credentials: any)."""
    server = Path(sys.executable).with_name("moto_server")
    if not server.exists():
        pytest.skip("moto[server] is not installed (the dev extra has it)")
    port = free_port()
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "moto.log", "w"))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "moto.log").read_text()
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _uri(endpoint: str, path: str) -> str:
    # Credentials in the URI: the executors and the CLI process see the same filesystem.
    return (f"s3://testing:testing@{path}?endpoint_override={endpoint}&scheme=http&region=us-east-1"
            "&allow_bucket_creation=true")


def _cli_query(uri: str, value: str) -> set[tuple[str, int, int]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AWS_EC2_METADATA_DISABLED": "true"}
    out = subprocess.run([sys.executable, "-m", "app.cli", "index", "query", "--index", uri, "--value", value,
                          "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pyspark" not in out.stderr
    return {(r["key"], r["partition"], r["seqno"]) for r in map(json.loads, out.stdout.splitlines())}


def _check(uri: str, expected: set[tuple[str, str, int, int]], cli_value: str) -> None:
    """Every city through ``lookup`` (in process), one through ``upr index query`` (new process)."""
    for city in CITIES:
        assert {(e["key"], e["partition"], e["seqno"]) for e in lookup(uri, city)} == \
            {(k, p, s) for v, k, p, s in expected if v == city}, city
    assert _cli_query(uri, cli_value) == {(k, p, s) for v, k, p, s in expected if v == cli_value}


def test_an_empty_batch_that_moves_no_seqno_commits_nothing():
    at = {"v": 1, "np": 2, "p": {"0": {"u": "7", "s": 10, "ss": 8, "se": 12, "g": 0, "o": True},
                                  "1": {"u": "7", "s": 0, "ss": 0, "se": 0, "g": 0}}}
    closed = json.loads(json.dumps(at).replace('"se": 12, "g": 0, "o": true', '"se": 10, "g": 0'))
    assert _same_seqnos(closed, at)
    moved = json.loads(json.dumps(at).replace('"s": 10', '"s": 11'))
    reset = json.loads(json.dumps(at).replace('"s": 0, "ss": 0, "se": 0, "g": 0', '"s": 0, "ss": 0, "se": 0, "g": 1'))
    assert not _same_seqnos(moved, at) and not _same_seqnos(reset, at)
    assert not _same_seqnos(at, None) and not _same_seqnos({"v": 1, "latest": True}, at)


@pytest.mark.timeout(600)
def test_an_index_on_s3_is_built_updated_switched_and_queried_there(spark, upr_server, s3_endpoint):
    srv = upr_server(partitions=4)
    rng = random.Random(5)
    live: set[str] = set()
    bulk(srv.url, random_ops(rng, KEYS, live, 400))
    uri = _uri(s3_endpoint, "upr-indexes/city")
    open_location(uri).fs.create_dir("upr-indexes")            # the bucket

    # Full build with every run written by Spark tasks through pyarrow (no Hadoop S3 connector).
    first = IndexJob(spark, uri, srv.url, FieldIndex("city"), local_batch_rows=-1, max_runs=1).run()
    assert first.batches == 1 and first.rows_read >= len(live)
    _check(uri, brute_force(srv.url, KEYS), "oslo")

    # An update reads only the changes (from the manifest's offset), then compacts (max_runs=1:
    # Spark reads the runs back from S3 and writes the merged run there).
    changes = random_ops(rng, KEYS, live, 40, delete_ratio=0.3)
    bulk(srv.url, changes)
    second = IndexJob(spark, uri, srv.url, FieldIndex("city"), max_runs=1).run()
    assert second.batches == 1 and len({op["key"] for op in changes}) <= second.rows_read <= len(changes)
    where = open_location(uri)
    manifest = load(where)
    assert manifest.generation == second.generation > first.generation and manifest.batch_id == 1
    assert len(manifest.runs) == 1 and manifest.runs[0].path.startswith("runs/c-")
    assert f"gen-{manifest.generation:06d}.json" in where.list_dir("history")
    assert [n for n in where.list_dir("") if ".tmp" in n] == []
    _check(uri, brute_force(srv.url, KEYS), "rome")

