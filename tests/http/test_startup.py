"""Start-up refusals a newcomer meets are one line on stderr and a non-zero exit, not a traceback
and not a silently ignored flag."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.server import ROOT, start_server

pytestmark = pytest.mark.slow


def _server(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPR_")}
    return subprocess.run([sys.executable, "-m", "app.cli", "server", "--data-dir", str(data_dir), "--port", "0",
                           "--log-level", "warning", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_second_server_on_a_data_dir_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    srv = start_server(tmp_path, partitions=2)
    try:
        r = _server(srv.data_dir)
        assert r.returncode == 2
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("upr: ") and "already open" in r.stderr and str(srv.data_dir) in r.stderr
        assert httpx.get(srv.url + "/health").status_code == 200  # the first one is unharmed
    finally:
        srv.stop()


def test_partitions_flag_that_the_data_dir_does_not_have_is_refused(tmp_path: Path) -> None:
    srv = start_server(tmp_path, partitions=2)
    srv.stop()
    r = _server(srv.data_dir, "--partitions", "8")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "has 2 partitions" in r.stderr and "--partitions 8" in r.stderr
    # the same count, or none at all, starts as usual: the stored count wins
    again = start_server(tmp_path, data_dir=srv.data_dir, partitions=2)
    try:
        assert httpx.get(again.url + "/status").json()["partitions"] == 2
    finally:
        again.stop()
