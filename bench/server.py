"""Start a real ``upr server`` process for a benchmark, on 127.0.0.1 and a kernel-chosen port.

WHY one helper: every bench script needs the same steps (command line, ``--port 0`` with a ready
file, wait for ``GET /ready``, fail with the log's tail if the process dies), and four copies had
drifted apart (some ignored ``UPR_*`` variables of the caller's shell, some did not).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["server_command", "start_upr_server", "wait_for_url"]

#: spawns argv with its output sent to a log file and returns the process (e.g. ProcessGroup.spawn)
Spawn = Callable[[Sequence[str], Path], "subprocess.Popen[Any]"]


def server_command(data_dir: Path, ready_file: Path, *, partitions: int | None = None,
                   extra: Sequence[str] = ()) -> list[str]:
    """``upr server`` on 127.0.0.1, port 0, writing its URL to ``ready_file`` once it listens."""
    cmd = [sys.executable, "-m", "app.cli", "server", "--data-dir", str(data_dir), "--host", "127.0.0.1",
           "--port", "0", "--ready-file", str(ready_file), "--log-level", "warning"]
    if partitions is not None:
        cmd += ["--partitions", str(partitions)]
    return [*cmd, *extra]


def server_env() -> dict[str, str]:
    """The caller's environment without ``UPR_*`` settings, so a bench measures the defaults."""
    return {k: v for k, v in os.environ.items() if not k.startswith("UPR_")}


def _log_tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"


def wait_for_url(proc: "subprocess.Popen[Any]", ready_file: Path, log: Path, timeout: float = 60.0,
                 check_ready: bool = True) -> str:
    """The server's URL once its ready file exists (and, with ``check_ready``, ``GET /ready`` is 200)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"upr server exited with {proc.returncode}: {_log_tail(log)}")
        url = ready_file.read_text().strip() if ready_file.exists() else ""
        if url:
            if not check_ready:
                return url
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"upr server not ready after {timeout:.0f}s: {_log_tail(log)}")


def _popen(argv: Sequence[str], log: Path) -> "subprocess.Popen[Any]":
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), cwd=ROOT, env=server_env(), stdout=out, stderr=subprocess.STDOUT)


def start_upr_server(workdir: Path, *, name: str = "server", data_dir: Path | None = None,
                     partitions: int | None = None, extra: Sequence[str] = (), timeout: float = 60.0,
                     spawn: Spawn = _popen) -> tuple["subprocess.Popen[Any]", str]:
    """Start a server whose files live in ``workdir`` (``<name>.url``, ``<name>.log``); return it and its URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    ready, log = workdir / f"{name}.url", workdir / f"{name}.log"
    ready.unlink(missing_ok=True)
    cmd = server_command(data_dir or workdir / name, ready, partitions=partitions, extra=extra)
    proc = spawn(cmd, log)
    return proc, wait_for_url(proc, ready, log, timeout)
