"""Take a container that can never be part of a reference cycle out of the cyclic GC's scans.

Why: a write queue's ``pvector`` holds only ``Item`` tuples (bytes and ints) and ``None``, so it
cannot close a cycle, yet CPython's collector visits every one of its slots (pyrsistent's C
``tp_traverse`` walks the whole vector) each time it examines the vector.  Every write batch
publishes a new vector per partition it touched, so, tracked, each young-generation collection would walk
every queued item of those partitions: its pause would grow with the queue, not with the young
generation (docs/benchmarks.md, Peers: tail GC pauses).  Untracked, a vector costs the
collector nothing; the items it holds stay tracked and are still found reachable (a reference
from an untracked container counts as an outside reference).

``PyObject_GC_UnTrack`` is CPython's public C API (idempotent: the object's own deallocator
calls it again).  Elsewhere (no ``ctypes.pythonapi``) this does nothing.
"""
from __future__ import annotations

import ctypes
from typing import TypeVar

__all__ = ["untrack"]

T = TypeVar("T")


def _load() -> object | None:
    try:
        fn = ctypes.pythonapi.PyObject_GC_UnTrack
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.py_object]
    fn.restype = None
    return fn


_UNTRACK = _load()


def untrack(obj: T) -> T:
    """``obj``, no longer tracked by the cyclic GC.  Only for objects that cannot reach a cycle."""
    if _UNTRACK is not None:
        _UNTRACK(obj)  # type: ignore[operator]
    return obj
