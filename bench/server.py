"""Start a real ``upr server`` process for a benchmark, on 127.0.0.1 and a kernel-chosen port.

The command line, the environment without ``UPR_*`` and the ready-wait are the test suite's
(``tests/support/server.py``): a benchmark runs from a checkout, like the tests, and both must
start the server the same way.  This module adds what only benchmarks need: a choice of how the
process is spawned (``ProcessGroup.spawn`` keeps peers and servers in one group).
"""
from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.server import ROOT, server_command, server_env, wait_for_url

__all__ = ["server_command", "server_env", "start_upr_server", "wait_for_url"]

#: spawns argv with its output sent to a log file and returns the process (e.g. ProcessGroup.spawn)
Spawn = Callable[[Sequence[str], Path], "subprocess.Popen[Any]"]


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
