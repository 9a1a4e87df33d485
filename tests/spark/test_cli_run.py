"""``upr index run`` as a real process: progress per batch, clean stops on SIGTERM, one-line failures."""
from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from spark_connector.index.lookup import lookup
from tests.spark.helpers import brute_force, bulk, random_ops

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"doc-{i:05d}" for i in range(300)]


def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "spark_connector.cli", "index", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _lines(stream) -> queue.Queue:  # type: ignore[no-untyped-def]
    out: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [out.put(line.rstrip("\n")) for line in stream], daemon=True).start()
    return out


def _next_line(lines: queue.Queue, proc: subprocess.Popen, prefix: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert proc.poll() is None, f"exited {proc.returncode}: {proc.stderr.read()[-3000:]}"
            continue
        if line.startswith(prefix):
            return line
    pytest.fail(f"no line starting {prefix!r} within {timeout} s")


def _drain(lines: queue.Queue) -> list[str]:
    """The lines still coming from an exited process's stdout."""
    out = []
    while True:
        try:
            out.append(lines.get(timeout=3))
        except queue.Empty:
            return out


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.timeout(900)
def test_follow_prints_a_line_per_batch_sigterm_stops_cleanly_and_a_rollback_fails_in_one_line(upr_server, tmp_path):
    """Two runs of ``upr index run`` on one index: ``--follow`` until SIGTERM, then, once the
    server purged tombstones the index never streamed (its positions fall below the purge seqno:
    a rollback to 0 by the server's rule, with no timing involved), ``--on-rollback fail``."""
    srv = upr_server(partitions=4)
    rng = random.Random(21)
    live: set[str] = set()
    bulk(srv.url, random_ops(rng, KEYS, live, 300))
    proc = _cli("run", "--server", srv.url, "--index", str(tmp_path / "idx"), "--field", "city",
                "--spark-master", "local[2]", "--follow", "--interval", "1")
    try:
        lines = _lines(proc.stdout)
        first = _next_line(lines, proc, "batch 0:", 240)
        assert "change(s), lag 0 seqnos," in first, first
        bulk(srv.url, random_ops(rng, KEYS, live, 40, delete_ratio=0.3))
        later = _next_line(lines, proc, "batch ", 120)
        assert "change(s), lag" in later and not later.startswith("batch 0:"), later
        proc.send_signal(signal.SIGTERM)        # the CLI process only, as a service manager does
        assert proc.wait(timeout=120) == 0
        rest = [lines.get(timeout=5) for _ in range(lines.qsize())]
        stderr = proc.stderr.read()
    finally:
        _stop(proc)
    assert any(line.endswith("(stopped by signal)") for line in rest), rest
    assert "Traceback" not in stderr and "py4j" not in stderr, stderr[-3000:]
    expected = brute_force(srv.url, KEYS)
    for city in ("oslo", "lima"):
        assert {(city, e["key"], e["partition"], e["seqno"]) for e in lookup(tmp_path / "idx", city)} == \
            {row for row in expected if row[0] == city}

    bulk(srv.url, [{"op": "delete", "key": k} for k in sorted(live)[:100]], durability="persist")
    highs = {p["partition"]: p["high_seqno"] for p in httpx.get(f"{srv.url}/partitions").json()["partitions"]}
    r = httpx.post(f"{srv.url}/admin/compact", json={"purge_before_seqno": {str(p): h + 1 for p, h in highs.items()}})
    assert r.status_code == 200 and all(s > 0 for s in r.json()["purge_seqnos"].values()), r.text
    proc = _cli("run", "--server", srv.url, "--index", str(tmp_path / "idx"), "--field", "city",
                "--spark-master", "local[2]", "--on-rollback", "fail")
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        _stop(proc)
    assert proc.returncode == 1, err[-3000:]
    ours = [line for line in err.splitlines() if line.startswith("upr index:")]
    assert len(ours) == 1 and ours[0].startswith("upr index: ROLLBACK_REQUIRED partition "), err[-3000:]
    assert "Traceback" not in err and "=== Streaming Query ===" not in err, err[-3000:]


@pytest.mark.timeout(900)
def test_ctrl_c_stops_follow_cleanly_with_exit_130(upr_server, tmp_path):
    # Ctrl-C in a terminal signals the whole foreground process group: the CLI, Spark's JVM and
    # its Python workers.  `upr` itself (app.cli), as a user runs it.
    srv = upr_server(partitions=4)
    bulk(srv.url, random_ops(random.Random(3), KEYS, set(), 100))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "index", "run", "--server", srv.url, "--index",
                             str(tmp_path / "idx"), "--field", "city", "--spark-master", "local[2]", "--follow",
                             "--interval", "1"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        lines = _lines(proc.stdout)
        _next_line(lines, proc, "batch 0:", 600)        # a JVM start: minutes on a loaded machine
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130
        stderr = proc.stderr.read()
        rest = _drain(lines)
    finally:
        _stop(proc)
    assert any(line.endswith("(stopped by signal)") for line in rest), (rest, stderr[-3000:])
    ours = [line for line in stderr.splitlines() if line.startswith("upr index:")]
    assert ours == ["upr index: stopping the query ..."], stderr[-3000:]
    assert "Traceback" not in stderr and "py4j" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
