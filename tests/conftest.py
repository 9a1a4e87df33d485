"""Fixtures shared by every test package.

``upr_server``: start real ``upr server`` processes on 127.0.0.1 with an ephemeral port::

    def test_x(upr_server):
        srv = upr_server(partitions=8)                 # data dir under tmp_path
        httpx.get(f"{srv.url}/health")
        srv.kill()                                     # SIGKILL
        srv2 = upr_server(data_dir=srv.data_dir)       # restart on the same data

Options: ``data_dir``, ``partitions``, ``args`` (extra CLI flags), ``env`` (extra
environment), ``tokens`` (mapping token -> role, written to a tokens file), ``timeout``.
Every process started is killed at teardown.  The server writes its bound URL to a
``--ready-file``; the fixture then waits for ``GET /ready``.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.server import server_env, wait_for_url

ROOT = Path(__file__).resolve().parents[1]


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


def start_server(
    workdir: Path,
    *,
    data_dir: Path | None = None,
    partitions: int = 8,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    tokens: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> ServerProcess:
    """Start ``python -m app.cli server`` and wait until it is ready (or raise with its log)."""
    workdir.mkdir(parents=True, exist_ok=True)
    n = len(list(workdir.glob("server-*.log")))
    data_dir = data_dir or workdir / "data"
    ready_file = workdir / f"server-{n}.url"
    log_path = workdir / f"server-{n}.log"
    ready_file.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "app.cli", "server", "--data-dir", str(data_dir), "--host", "127.0.0.1",
        "--port", "0", "--partitions", str(partitions), "--ready-file", str(ready_file), "--log-level", "warning",
        *args,
    ]
    headers: dict[str, str] = {}
    if tokens:
        tokens_file = workdir / f"tokens-{n}.json"
        import json

        tokens_file.write_text(json.dumps({"tokens": dict(tokens)}))
        cmd += ["--tokens-file", str(tokens_file)]
        admin = [t for t, r in tokens.items() if r == "admin"]
        if admin:
            headers["Authorization"] = f"Bearer {admin[0]}"
    full_env = {**server_env(), **(env or {})}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess("", proc, data_dir, log_path, headers)
    try:
        server.url = wait_for_url(proc, ready_file, log_path, timeout)
    except RuntimeError:
        server.kill()  # wait_for_url only signals it; reap it before the test fails
        raise
    return server


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
