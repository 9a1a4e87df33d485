"""Processes the suite starts, and how it makes sure every one of them stops.

The machine is shared, so a benchmark that leaves a Redis or a postmaster behind is a bug. Every
process goes through :class:`ProcessGroup`, which remembers it by PID and stops it with its own
signal (then SIGKILL after a bounded wait) when the group exits, whether by return, exception or
KeyboardInterrupt. As a last resort a child also gets PR_SET_PDEATHSIG=SIGKILL, so it dies if the
suite itself is SIGKILLed (spawn only from the main thread: the signal follows the forking thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from bench.suite.ports import free_port  # noqa: F401 - the peers and cluster benches import it from here

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort; the group still stops it by PID
        pass


#: every process started in this run, as (pid, name): kept in results.json so a test can check that
#: none of them outlived the run
SPAWNED: list[tuple[int, str]] = []
_LIVE_GROUPS: weakref.WeakSet[ProcessGroup] = weakref.WeakSet()


def stop_everything() -> None:
    """Stop every process of every live group now (from a signal handler: the event loop may be
    stuck in a task that swallows cancellation, so cleanup must not wait for the tasks to unwind)."""
    for group in list(_LIVE_GROUPS):
        group.stop_all()


class StartError(RuntimeError):
    """A process did not come up; the message carries the tail of its log."""


class ProcessGroup:
    """Owns child processes by PID; ``with ProcessGroup() as g:`` stops them all on exit."""

    def __init__(self) -> None:
        self._procs: list[tuple[subprocess.Popen[Any], int, str]] = []
        _LIVE_GROUPS.add(self)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def spawn(
        self,
        argv: Sequence[str],
        *,
        name: str,
        log: Path | None = None,
        stop_signal: int = signal.SIGTERM,
        user: str | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        stdin: int | IO[Any] | None = subprocess.DEVNULL,
        stdout: int | IO[Any] | None = None,
    ) -> subprocess.Popen[Any]:
        log_file = open(log, "ab") if log is not None else None  # noqa: SIM115 - closed below
        sink: int | IO[Any] = log_file if log_file is not None else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=stdin,
                stdout=stdout if stdout is not None else sink,
                stderr=sink,
                cwd=cwd,
                env=env,
                user=user,
                group=user,
                extra_groups=[] if user else None,
                preexec_fn=_die_with_parent,
            )
        finally:
            if log_file is not None:
                log_file.close()
        self._procs.append((proc, stop_signal, name))
        SPAWNED.append((proc.pid, name))
        return proc

    def stop(self, proc: subprocess.Popen[Any], timeout: float = 15.0) -> int | None:
        """Stop one process by its PID with its own signal, SIGKILL after ``timeout`` seconds."""
        for i, (p, sig, _name) in enumerate(self._procs):
            if p is proc:
                del self._procs[i]
                return _stop(p, sig, timeout)
        return _stop(proc, signal.SIGTERM, timeout)

    def stop_all(self) -> None:
        while self._procs:  # newest first: consumers before the servers they read from
            proc, sig, _name = self._procs.pop()
            _stop(proc, sig, 15.0)
        _LIVE_GROUPS.discard(self)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _s, _n in self._procs if p.poll() is None]

    def cpu_seconds(self, exclude_prefix: str = "consumer") -> float:
        """CPU time (user+system, plus reaped children: postgres backends) of the live servers."""
        import psutil

        total = 0.0
        for p, _s, name in self._procs:
            if name.startswith(exclude_prefix) or p.poll() is not None:
                continue
            try:
                t = psutil.Process(p.pid).cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
                for child in psutil.Process(p.pid).children(recursive=True):  # live backends
                    ct = child.cpu_times()
                    total += ct.user + ct.system
            except psutil.Error:
                continue
        return total


def _stop(proc: subprocess.Popen[Any], sig: int, timeout: float) -> int | None:
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
            proc.wait(timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:  # e.g. BrokenPipeError flushing a pipe the process no longer reads
                pass
    return proc.returncode


def wait_for_port(port: int, proc: subprocess.Popen[Any], log: Path | None, timeout: float = 30.0) -> None:
    """Poll until something accepts on 127.0.0.1:port; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StartError(f"exited with {proc.returncode}: {log_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise StartError(f"not listening on 127.0.0.1:{port} after {timeout:.0f}s: {log_tail(log)}")


def log_tail(log: Path | None, lines: int = 5) -> str:
    if log is None or not log.exists():
        return "(no log)"
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) or "(empty log)"
