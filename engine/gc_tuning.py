"""Applies ``engine.core.gc_policy`` to this process's cyclic GC (process-wide, like the GC).

``apply`` sets the thresholds and registers one ``gc.callbacks`` hook (once per process; a later
``apply`` replaces the policy) that feeds each finished collection to the policy's
``FullCollectionClock``.  ``freeze_start_up`` moves everything alive once a server has started
(modules, classes, the app, the opened engine) out of every later collection: those objects
live as long as the process, and a full collection would otherwise examine them all each time.
"""
from __future__ import annotations

import gc
import threading
import time
from typing import Any

from engine.core.gc_policy import FullCollectionClock, GcPolicy

__all__ = ["apply", "current", "freeze_start_up"]

_lock = threading.Lock()
_clock: FullCollectionClock | None = None


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    clock = _clock
    if phase != "stop" or clock is None:
        return
    wanted = clock.collected(info["generation"], time.monotonic())
    if wanted is not None:
        gc.set_threshold(*wanted)


def apply(policy: GcPolicy) -> None:
    """Run this process's cyclic GC by ``policy`` from now on."""
    global _clock
    with _lock:
        clock = FullCollectionClock(policy, time.monotonic())
        if _clock is None:
            gc.callbacks.append(_on_collection)
        _clock = clock
        gc.set_threshold(*clock.thresholds())


def current() -> GcPolicy | None:
    """The policy ``apply`` installed, if any."""
    clock = _clock
    return None if clock is None else clock.policy


def freeze_start_up() -> None:
    """Collect once, then exclude every object alive now from later collections (``gc.freeze``).

    Call once the process has started serving: what is alive then lives as long as the process
    (freed objects still go by reference counting; only a cycle among them would outlive the
    process's need for it, and the collection first frees the ones already garbage)."""
    gc.collect()
    gc.freeze()
