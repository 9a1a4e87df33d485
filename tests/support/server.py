"""Real ``upr server`` processes on 127.0.0.1 with a kernel-chosen port.

``start_server`` is what tests use (through the ``upr_server`` fixture or directly for a
module-scoped server); ``server_command``, ``server_env`` and ``wait_for_url`` are the steps it is
made of, which ``bench/server.py`` reuses so the ready-wait and the ``UPR_*`` filtering exist
once.  The server writes its bound URL to a ``--ready-file``; we then wait for ``GET /ready``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "ServerProcess", "server_command", "server_env", "start_server", "wait_for_url"]


def server_command(data_dir: Path, ready_file: Path, *, partitions: int | None = None,
                   extra: Sequence[str] = ()) -> list[str]:
    """``upr server`` on 127.0.0.1, port 0, writing its URL to ``ready_file`` once it listens."""
    cmd = [sys.executable, "-m", "app.cli", "server", "--data-dir", str(data_dir), "--host", "127.0.0.1",
           "--port", "0", "--ready-file", str(ready_file), "--log-level", "warning"]
    if partitions is not None:
        cmd += ["--partitions", str(partitions)]
    return [*cmd, *extra]


def server_env() -> dict[str, str]:
    """The caller's environment without ``UPR_*`` settings, so a run measures what it asks for."""
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


@dataclass
class ServerProcess:
    url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (crash test)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def start_server(workdir: Path, *, timeout: float = 60.0, **options: Any) -> ServerProcess:
    """Start ``python -m app.cli server`` and wait until it is ready (or raise with its log).

    ``options`` are ``spawn_server``'s: ``data_dir``, ``partitions``, ``args`` (extra flags),
    ``env`` (extra environment; the caller's ``UPR_*`` are dropped) and ``tokens`` (token -> role,
    written to a tokens file; the first admin token becomes ``headers``).  Files live in
    ``workdir`` (``server-N.log``, ``server-N.url``)."""
    return spawn_server(workdir, **options).wait_ready(timeout)


@dataclass
class SpawnedServer:
    """A server process started but not yet known to be ready: several of them start side by side
    (a cluster's nodes), each then waited for."""

    server: ServerProcess
    ready_file: Path

    def wait_ready(self, timeout: float = 30.0) -> ServerProcess:
        try:
            self.server.url = wait_for_url(self.server.proc, self.ready_file, self.server.log_path, timeout)
        except RuntimeError:
            self.server.kill()  # wait_for_url only signals it; reap it before the test fails
            raise
        return self.server


def spawn_server(
    workdir: Path,
    *,
    data_dir: Path | None = None,
    partitions: int = 8,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    tokens: Mapping[str, str] | None = None,
) -> SpawnedServer:
    """``start_server`` without the wait: the process runs, its URL is not known yet."""
    workdir.mkdir(parents=True, exist_ok=True)
    n = len(list(workdir.glob("server-*.log")))
    data_dir = data_dir or workdir / "data"
    ready_file = workdir / f"server-{n}.url"
    log_path = workdir / f"server-{n}.log"
    ready_file.unlink(missing_ok=True)
    extra = list(args)
    headers: dict[str, str] = {}
    if tokens:
        tokens_file = workdir / f"tokens-{n}.json"
        tokens_file.write_text(json.dumps({"tokens": dict(tokens)}))
        extra += ["--tokens-file", str(tokens_file)]
        admin = [t for t, r in tokens.items() if r == "admin"]
        if admin:
            headers["Authorization"] = f"Bearer {admin[0]}"
    cmd = server_command(data_dir, ready_file, partitions=partitions, extra=extra)
    full_env = {**server_env(), **(env or {})}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    return SpawnedServer(ServerProcess("", proc, data_dir, log_path, headers), ready_file)
