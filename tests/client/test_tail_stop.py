"""``upr tail --from state:DIR`` keeps its position when it is stopped the way services are stopped.

systemd and Kubernetes stop a process with SIGTERM (then SIGKILL after a grace period), so the
position must be saved on SIGTERM as on Ctrl-C, and saved while the stream is idle, or a SIGKILL
after a quiet spell makes the next run print everything again.  Real server, real ``upr tail``
processes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.server import ROOT

pytestmark = pytest.mark.slow

DOCS = 40


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("UPR_")}


def _start_tail(url: str, state: Path) -> tuple[subprocess.Popen[bytes], list[dict]]:
    """Start ``upr tail`` and collect its lines in a thread (so the pipe never fills)."""
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "tail", "--server", url, "--from", f"state:{state}"],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[dict] = []

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.append(json.loads(raw))

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def _wait(cond, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _write(url: str) -> None:
    ops = [{"op": "set", "key": f"k{i}", "value": {"i": i}} for i in range(DOCS)]
    r = httpx.post(f"{url}/docs/_bulk", json=ops, timeout=60)
    assert r.status_code == 200 and all(x["status"] == 200 for x in r.json()["results"]), r.text


def _covered(state: Path, lines: list[dict]) -> bool:
    """The saved state covers every printed line (its partition's seqno is at or past it)."""
    try:
        doc = json.loads((state / "state.json").read_bytes())
    except (FileNotFoundError, ValueError):
        return False
    seqnos = {int(p): c["offset"]["seqno"] for p, c in doc["partitions"].items()}
    return all(seqnos.get(line["partition"], 0) >= line["seqno"] for line in lines)


def _rerun(url: str, state: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "app.cli", "tail", "--server", url, "--from", f"state:{state}",
                           "--until", "now"], cwd=ROOT, env=_env(), capture_output=True, timeout=120)


def test_sigterm_saves_the_position_so_the_next_run_prints_nothing_again(upr_server, tmp_path):
    srv = upr_server(partitions=4)
    _write(srv.url)
    state = tmp_path / "st"
    proc, lines = _start_tail(srv.url, state)
    try:
        assert _wait(lambda: len(lines) >= DOCS), f"only {len(lines)} lines"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert code == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    assert _covered(state, lines), (state / "state.json").read_text() if (state / "state.json").exists() else "none"
    again = _rerun(srv.url, state)
    assert again.returncode == 0, again.stderr
    assert again.stdout == b"", "the next run re-printed what the stopped one had printed"


def test_an_idle_tail_saves_its_position_so_a_later_sigkill_loses_nothing(upr_server, tmp_path):
    srv = upr_server(partitions=4)
    _write(srv.url)
    state = tmp_path / "st"
    proc, lines = _start_tail(srv.url, state)
    try:
        assert _wait(lambda: len(lines) >= DOCS), f"only {len(lines)} lines"
        # nothing more arrives: the position must still reach the disk within the commit interval
        assert _wait(lambda: _covered(state, lines), timeout=30), "the idle tail never saved its position"
    finally:
        proc.kill()
        proc.wait()
    again = _rerun(srv.url, state)
    assert again.returncode == 0, again.stderr
    assert again.stdout == b""
