"""Getting the peers and their Python clients onto the machine, or saying exactly why not.

Peers come from Debian packages (``apt-get``, only when running as root), Python clients from PyPI
through pip in this interpreter. Each attempt is timed and reported, and a failure becomes a
:class:`Skip` carrying the reason, which the table prints instead of a figure: never a fake row.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class Skip(Exception):
    """This system cannot run here; ``str(exc)`` is the reason shown in the table."""


@dataclass
class InstallLog:
    """What the suite installed in this run, with the time it took (kept in results.json)."""

    allow: bool = True
    apt_timeout_s: float = 300.0
    steps: list[dict[str, object]] = field(default_factory=list)
    _apt_updated: bool = False

    def record(self, what: str, action: str, seconds: float, detail: str = "") -> None:
        self.steps.append({"what": what, "action": action, "seconds": round(seconds, 2), "detail": detail})


def which(names: list[str], extra_dirs: list[str] | None = None) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
        for d in extra_dirs or []:
            cand = os.path.join(d, name)
            if os.access(cand, os.X_OK):
                return cand
    return None


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def ensure_debian_package(log: InstallLog, package: str, present: Callable[[], str | None]) -> str:
    """Return what ``present()`` finds, installing ``package`` with apt-get first if it is missing."""
    found = present()
    if found:
        log.record(package, "present", 0.0, found)
        return found
    if not log.allow:
        raise Skip(f"{package} not installed and installing was disabled (--no-install)")
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Skip(f"{package} not installed and apt-get as root is unavailable here")
    t0 = time.monotonic()
    try:
        if not log._apt_updated:
            upd = _run(["apt-get", "update", "-q"], log.apt_timeout_s)
            log._apt_updated = upd.returncode == 0
        policy = _run(["apt-cache", "policy", package], 60)
        if "Candidate:" not in policy.stdout or "Candidate: (none)" in policy.stdout:
            raise Skip(f"no Debian package {package!r} available (apt-cache policy shows no candidate)")
        res = _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package], log.apt_timeout_s)
    except subprocess.TimeoutExpired:
        log.record(package, "failed", time.monotonic() - t0, "timeout")
        raise Skip(f"apt-get install {package} timed out after {log.apt_timeout_s:.0f}s") from None
    elapsed = time.monotonic() - t0
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["?"]
        log.record(package, "failed", elapsed, tail[0])
        raise Skip(f"apt-get install {package} failed: {tail[0]}")
    found = present()
    if not found:
        log.record(package, "failed", elapsed, "installed but binary not found")
        raise Skip(f"{package} installed but its binary was not found")
    log.record(package, "apt-get install", elapsed, found)
    return found


def ensure_python(log: InstallLog, requirements: list[str], modules: list[str]) -> dict[str, str]:
    """Import ``modules``, pip-installing ``requirements`` if any is missing; return their versions."""
    missing = [m for m in modules if not _importable(m)]
    if missing:
        if not log.allow:
            raise Skip(f"Python modules {missing} missing and installing was disabled (--no-install)")
        t0 = time.monotonic()
        try:
            res = subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", *requirements],
                capture_output=True, text=True, timeout=600, check=False,
            )
        except subprocess.TimeoutExpired:
            raise Skip(f"pip install {' '.join(requirements)} timed out") from None
        log.record(" ".join(requirements), "pip install", time.monotonic() - t0, res.stderr.strip()[-200:])
        importlib.invalidate_caches()
        still = [m for m in modules if not _importable(m)]
        if res.returncode != 0 or still:
            raise Skip(f"pip install {' '.join(requirements)} failed: {res.stderr.strip()[-200:]}")
    return {m: _dist_version(m) for m in modules}


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


_DISTS = {"nats": "nats-py", "psycopg": "psycopg", "redis": "redis", "hiredis": "hiredis"}


def _dist_version(module: str) -> str:
    try:
        return importlib.metadata.version(_DISTS.get(module, module))
    except importlib.metadata.PackageNotFoundError:
        return "?"


def command_version(argv: list[str]) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"? ({exc})"
    return (res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr).strip() else "?"
