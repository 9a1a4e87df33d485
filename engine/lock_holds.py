"""Debug figures of who holds the engine's locks, and for how long (opt-in: ``UPR_LOCK_HOLDS=1``).

WHY: a write on a node waits for the writer lock and the LMDB turn, which the flusher, the
writer thread and the replica applier all take; on a loaded machine wall-clock latency cannot
say which of them a write waited for, but the length of each hold, counted by holder, can.  The
figures go out with ``Engine.engine_stats`` (``/metrics``) as ``hold_<lock>_<role>_*`` and
``wait_<lock>_<role>_*``: count, seconds in all, the longest, and how many were over 5, 20 and
100 ms.  Off by default: the wrapper costs two clock reads per acquisition.

A role is the holder's thread (``upr-flusher``, ``upr-writer``, the event loop, a worker
thread); ``note`` records other durations under a name of their own (the event loop's lag).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

#: hold lengths counted separately (seconds)
OVER_S = (0.005, 0.020, 0.100)

ENABLED = os.environ.get("UPR_LOCK_HOLDS", "") not in ("", "0")


class _Figure:
    __slots__ = ("count", "total", "longest", "over")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.longest = 0.0
        self.over = [0] * len(OVER_S)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        if seconds > self.longest:
            self.longest = seconds
        for i, bound in enumerate(OVER_S):
            if seconds > bound:
                self.over[i] += 1


_figures: dict[str, _Figure] = {}
_guard = threading.Lock()


def note(name: str, seconds: float) -> None:
    """Count one duration under ``name``."""
    with _guard:
        fig = _figures.get(name)
        if fig is None:
            fig = _figures[name] = _Figure()
        fig.add(seconds)


_roles = threading.local()


def set_role(role: str | None) -> None:
    """Count this thread's holds under ``role`` from now on (None: by the thread's name again),
    e.g. a pool thread applying a replica run, which would else count as any pool thread."""
    _roles.role = role


def _role() -> str:
    named = getattr(_roles, "role", None)
    if named is not None:
        return named  # type: ignore[no-any-return]
    name = threading.current_thread().name
    if name.startswith("upr-flusher"):
        return "flusher"
    if name.startswith("upr-writer"):
        return "writer"
    if name == "MainThread":
        return "loop"
    if name.startswith(("asyncio_", "uvloop_", "ThreadPoolExecutor")):  # ``asyncio.to_thread``'s pool
        return "worker"
    return "other"


class TimedLock:
    """A lock (``threading.Lock`` or ``RLock``) that counts its holds and waits per role; a
    re-entered ``RLock`` counts as one hold, from the outer acquire to the outer release."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name
        self._local = threading.local()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        began = time.perf_counter()
        got = self._inner.acquire(blocking, timeout)
        if got:
            depth = getattr(self._local, "depth", 0)
            if depth == 0:
                now = time.perf_counter()
                role = _role()
                if blocking:
                    note(f"wait_{self._name}_{role}", now - began)
                self._local.since = now
            self._local.depth = depth + 1
        return got

    def release(self) -> None:
        depth = self._local.depth - 1
        self._local.depth = depth
        if depth == 0:
            note(f"hold_{self._name}_{_role()}", time.perf_counter() - self._local.since)
        self._inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def locked(self) -> bool:
        return self._inner.locked()  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:  # the wrapped lock's own figures (``LmdbTurn.waiting``)
        return getattr(self._inner, name)


def timed(lock: Any, name: str) -> Any:
    """``lock`` wrapped in a ``TimedLock`` when figures are on, else ``lock`` itself."""
    return TimedLock(lock, name) if ENABLED else lock


def figures() -> dict[str, float]:
    """The counted figures, flat, for ``Engine.engine_stats``."""
    out: dict[str, float] = {}
    with _guard:
        for name, fig in sorted(_figures.items()):
            out[f"{name}_count"] = float(fig.count)
            out[f"{name}_seconds_total"] = fig.total
            out[f"{name}_max_seconds"] = fig.longest
            for bound, n in zip(OVER_S, fig.over):
                out[f"{name}_over_{round(bound * 1000)}ms_count"] = float(n)
    return out
