"""End to end: real server processes, real PySpark (one shared local session), real SIGKILLs."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from spark_connector.cli import info, query
from spark_connector.index.functions import FieldIndex
from spark_connector.index.lookup import lookup
from spark_connector.index.job import IndexJob
from spark_connector.index.manifest import load
from spark_connector.index.view import load_index
from tests.spark.helpers import brute_force, brute_force_with, bulk, index_rows, random_ops

# The first test here starts the shared SparkSession (tests/conftest.py: the first file of its
# unit); under load the JVM's start alone has taken 140 s, past the default 300 s with the test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"doc-{i:05d}" for i in range(800)]


def _job(spark, d, srv, spark_path=False, **opts):
    """``spark_path``: write every run with a Spark job (tests' batches are small enough for the
    driver to write their runs by default, see IndexJob.local_batch_rows); tests use both paths."""
    return IndexJob(spark, d, srv.url, FieldIndex("city"), source_options={k: str(v) for k, v in opts.items()},
                    **({"local_batch_rows": -1} if spark_path else {}))


def test_index_equals_brute_force_and_incremental_reads_only_changes(spark, upr_server, tmp_path):
    srv = upr_server(partitions=8)
    rng = random.Random(7)
    live: set[str] = set()
    bulk(srv.url, random_ops(rng, KEYS, live, 2000))
    first = _job(spark, tmp_path / "inc", srv, spark_path=True).run()
    assert first.batches == 1 and first.rows_read >= len(live)
    assert index_rows(spark, tmp_path / "inc") == brute_force(srv.url, KEYS)

    changes = random_ops(rng, KEYS, live, 60, delete_ratio=0.3)
    bulk(srv.url, changes)
    changed = {op["key"] for op in changes}
    second = _job(spark, tmp_path / "inc", srv).run()
    # only the change set was read: each changed key at least once (dedup), never more than the ops
    assert len(changed) <= second.rows_read <= len(changes)
    expected = brute_force(srv.url, KEYS)
    assert index_rows(spark, tmp_path / "inc") == expected

    rebuilt = _job(spark, tmp_path / "full", srv).run()
    assert rebuilt.rows_read >= len(live)
    assert index_rows(spark, tmp_path / "full") == expected

    third = _job(spark, tmp_path / "inc", srv).run()        # nothing new: no batch, same generation
    assert third.batches == 0 and third.generation == second.generation

    # a custom index function through the same machinery: documents by the parity of "n"
    def parity(key: str, value: bytes) -> list[str]:
        n = json.loads(value).get("n")
        return [] if not isinstance(n, int) else ["even" if n % 2 == 0 else "odd"]

    custom = IndexJob(spark, tmp_path / "parity", srv.url, parity, name="parity").run()
    assert custom.batches == 1
    by_parity = {(r.value, r.key) for r in load_index(spark, tmp_path / "parity").collect()}
    assert by_parity == {(v, k) for v, k, _, _ in brute_force_with(srv.url, KEYS, parity)}

    # upr index query / info
    oslo = sorted(key for value, key, _, _ in expected if value == "oslo")
    assert [r.key for r in query(spark, str(tmp_path / "inc"), "oslo")] == oslo
    assert lookup(tmp_path / "inc", "oslo") == [                          # the JVM-free path agrees
        {"key": r.key, "partition": r.partition, "seqno": r.seqno} for r in query(spark, str(tmp_path / "inc"), "oslo")]
    runs = load(tmp_path / "inc").runs                             # from the sidecars, as from Parquet
    assert runs and all(run.sidecar for run in runs)
    for city in ("oslo", "lima", "absent"):
        assert lookup(tmp_path / "inc", city) == lookup(tmp_path / "inc", city, sidecars=False)
    about = info(str(tmp_path / "inc"))
    assert about["generation"] == second.generation and about["lag_total"] == 0
    highs = [p["high_seqno"] for p in httpx.get(f"{srv.url}/partitions").json()["partitions"]]
    assert sum(about["seqnos"].values()) == sum(highs)


def test_rollback_after_server_sigkill_applies_each_policy(spark, upr_server, tmp_path):
    srv = upr_server(partitions=4, args=["--flush-interval-ms", "60000"])
    rng = random.Random(11)
    live: set[str] = set()
    keys = KEYS[:500]
    bulk(srv.url, random_ops(rng, keys, live, 1200), durability="persist")
    before_crash = set(live)
    lost = random_ops(rng, keys, live, 300, delete_ratio=0.3)    # memory only: lost by the SIGKILL
    bulk(srv.url, lost)
    dirs = {policy: tmp_path / policy for policy in ("resetPartition", "refetch", "fail")}
    # one build (well inside the 60 s flush interval), copied: the three indexes hold the same
    # unpersisted mutations and the same checkpoint
    _job(spark, dirs["resetPartition"], srv).run()
    assert index_rows(spark, dirs["resetPartition"]) == brute_force(srv.url, keys)
    srv.kill()
    for policy in ("refetch", "fail"):
        shutil.copytree(dirs["resetPartition"], dirs[policy])
    srv = upr_server(data_dir=srv.data_dir, partitions=4, args=["--flush-interval-ms", "60000"])
    live = before_crash
    bulk(srv.url, random_ops(rng, keys, live, 100), durability="persist")   # the new branch
    expected = brute_force(srv.url, keys)

    reset = _job(spark, dirs["resetPartition"], srv, spark_path=True, onRollback="resetPartition").run()
    assert reset.resets, "a rollback must never be silent"
    assert index_rows(spark, dirs["resetPartition"]) == expected

    refetch = _job(spark, dirs["refetch"], srv, onRollback="refetch").run()
    assert refetch.rollbacks and refetch.refetched > 0
    assert index_rows(spark, dirs["refetch"]) == expected

    with pytest.raises(Exception, match=r"ROLLBACK_REQUIRED partition \d+ to seqno \d+"):
        _job(spark, dirs["fail"], srv, onRollback="fail").run()


def test_job_killed_mid_run_leaves_previous_generation_and_rerun_converges(spark, upr_server, tmp_path):
    srv = upr_server(partitions=4)
    rng = random.Random(5)
    live: set[str] = set()
    bulk(srv.url, random_ops(rng, KEYS, live, 1500))
    d = tmp_path / "idx"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_connector.cli", "index", "run", "--server", srv.url, "--index", str(d),
         "--field", "city", "--spark-master", "local[2]", "--max-offsets-per-trigger", "200"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300     # a JVM start: minutes on a loaded machine
        while time.monotonic() < deadline:
            m = load(d) if (d / "manifest.json").exists() else None
            if m is not None and m.batch_id >= 1:
                break
            assert proc.poll() is None, "the job finished before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("the job committed no batch within 300 s")
        os.killpg(proc.pid, signal.SIGKILL)     # the job and its Python workers, mid-run
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    killed_at = load(d)
    assert killed_at is not None and killed_at.batch_id < 30
    # the generation the manifest names is complete and readable
    partial = load_index(spark, d).count()
    assert 0 < partial
    for run in killed_at.runs:
        assert (d / run.path).is_dir()
    report = _job(spark, d, srv, maxOffsetsPerTrigger=100000).run()
    assert report.generation > killed_at.generation
    assert index_rows(spark, d) == brute_force(srv.url, KEYS)


def test_follow_keeps_the_index_updated_while_writes_continue(spark, upr_server, tmp_path):
    import threading

    srv = upr_server(partitions=4)
    rng = random.Random(3)
    live: set[str] = set()
    keys = KEYS[:300]
    bulk(srv.url, random_ops(rng, keys, live, 300))
    job = _job(spark, tmp_path / "follow", srv)
    done = threading.Event()    # the test stops the query once it saw what it waits for
    runner = threading.Thread(target=lambda: job.run(follow=True, interval_s=1.0, timeout_s=300, stop=done.is_set),
                              daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 180   # generous: a loaded machine is slower, not wrong
        while (job.manifest() is None or job.manifest().batch_id < 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        bulk(srv.url, random_ops(rng, keys, live, 100, delete_ratio=0.3))     # while the query runs
        expected = brute_force(srv.url, keys)
        while index_rows(spark, tmp_path / "follow") != expected and time.monotonic() < deadline:
            time.sleep(1)
        assert index_rows(spark, tmp_path / "follow") == expected
    finally:
        done.set()
    runner.join(120)
    assert not runner.is_alive()


def test_compaction_drops_markers_at_or_below_the_purge_seqno_and_keeps_newer_ones(spark, upr_server, tmp_path):
    srv = upr_server(partitions=4)
    keys = [f"m-{i:03d}" for i in range(200)]
    bulk(srv.url, [{"op": "set", "key": k, "value": {"city": "oslo"}} for k in keys], durability="persist")
    bulk(srv.url, [{"op": "delete", "key": k} for k in keys[:100]], durability="persist")
    d = tmp_path / "purge"

    def markers() -> set[str]:
        return {r.key for r in load_index(spark, d, markers=True).collect() if r.value is None}

    _job(spark, d, srv).run()
    assert markers() == set(keys[:100])
    highs = {p["partition"]: p["high_seqno"] for p in httpx.get(f"{srv.url}/partitions").json()["partitions"]}
    r = httpx.post(f"{srv.url}/admin/compact", json={"purge_before_seqno": {str(p): h + 1 for p, h in highs.items()}})
    assert r.status_code == 200 and all(s > 0 for s in r.json()["purge_seqnos"].values()), r.text

    bulk(srv.url, [{"op": "delete", "key": k} for k in keys[100:120]], durability="persist")   # after the purge
    job = _job(spark, d, srv)
    job.run()
    assert markers() == set(keys[:120])          # the incremental run adds its markers; none dropped yet
    job.compact()
    assert len(load(d).runs) == 1
    assert markers() == set(keys[100:120])       # only the markers above the purge seqnos are left
    assert index_rows(spark, d) == brute_force(srv.url, keys)


@pytest.mark.parametrize("in_driver", [True, False], ids=["pyarrow", "spark"])
def test_small_changes_compact_into_one_delta_run_and_leave_the_base_run_alone(spark, upr_server, tmp_path,
                                                                              monkeypatch, in_driver):
    import spark_connector.index.job as job_module
    monkeypatch.setattr(job_module, "MERGE_IN_DRIVER_ROWS", 10**9 if in_driver else 0)
    srv = upr_server(partitions=4)
    rng = random.Random(11)
    live: set[str] = set()
    keys = KEYS[:400]
    bulk(srv.url, [{"op": "set", "key": k, "value": {"city": rng.choice(["oslo", "lima"])}} for k in keys])
    live |= set(keys)
    d = tmp_path / "minor"
    IndexJob(spark, d, srv.url, FieldIndex("city"), max_runs=3).run()
    base = load(d).runs[0]
    for _ in range(3):          # deletions too: their markers must keep superseding base rows
        bulk(srv.url, random_ops(rng, keys, live, 10, delete_ratio=0.4))
        IndexJob(spark, d, srv.url, FieldIndex("city"), max_runs=3).run()
    runs = load(d).runs
    assert len(runs) == 2 and runs[0] == base and runs[1].path.startswith("runs/m-")
    assert index_rows(spark, d) == brute_force(srv.url, keys)
