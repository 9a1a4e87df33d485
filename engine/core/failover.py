"""Failover-log rules, as pure functions over tuples of ``FailoverEntry`` (newest first).

A failover log names the history branches a partition went through: entry ``(uuid, seqno)``
says "from ``seqno`` on, this partition's history is ``uuid``".  The rules follow
kv_engine's ``failover-table.cc`` (see docs/dcp notes §1):

* a new entry first removes every entry with a *higher* seqno: those items belonged to a
  branch that was abandoned (e.g. queued in memory when the process died);
* the log is capped, dropping the oldest entries;
* uuid 0 is never valid ("I have nothing" in a stream request), so it is never generated;
* on load, each invalid entry is erased on its own (``sanitise``: uuid 0, or a seqno above the
  last entry kept) and every valid entry stays, rather than refusing to start.

*When* an entry is added (creation, an unclean stop, promotion) is ``engine.core.failover_policy``.

Pure standard library: the stream protocol and clients reason about failover logs too.
"""
from __future__ import annotations

import secrets
import struct
from collections.abc import Iterable

from engine.core.types import FailoverEntry

FailoverLog = tuple[FailoverEntry, ...]

_ENTRY = struct.Struct(">QQ")
_UUID_MAX = (1 << 64) - 1


def new_uuid(existing: Iterable[FailoverEntry] = ()) -> int:
    """A random non-zero 64-bit uuid not already used in ``existing``."""
    used = {entry.uuid for entry in existing}
    while True:
        candidate = secrets.randbits(64)
        if candidate != 0 and candidate not in used:
            return candidate


def add_entry(log: FailoverLog, entry: FailoverEntry, cap: int) -> FailoverLog:
    """Return ``log`` with ``entry`` as the newest entry.

    Entries with a seqno above ``entry.seqno`` describe a diverged branch and are removed
    (equal seqnos stay: the old branch still covers up to that point).  At most ``cap``
    entries are kept, the oldest dropped first.
    """
    if cap < 1:
        raise ValueError("failover log cap must be at least 1")
    if entry.uuid == 0 or not 0 <= entry.uuid <= _UUID_MAX:
        raise ValueError("failover uuid must be a non-zero 64-bit integer")
    if entry.seqno < 0:
        raise ValueError("failover seqno must not be negative")
    kept = tuple(e for e in log if e.seqno <= entry.seqno)
    return ((entry,) + kept)[:cap]


def prune_above(log: FailoverLog, seqno: int) -> FailoverLog:
    """Drop entries above ``seqno`` (after a rollback to ``seqno``); may return ``()``."""
    return tuple(e for e in log if e.seqno <= seqno)


def sanitise(log: Iterable[FailoverEntry]) -> FailoverLog:
    """Erase each invalid entry of a newest-first log on its own, keeping every valid one.

    Invalid: uuid 0 (never generated), a negative seqno, or a seqno above that of the last entry
    *kept* (going older, seqnos must not ascend).  As kv_engine's ``sanitizeFailoverTable``:
    one damaged entry must not take the valid history behind it along, because a consumer on
    one of those branches would otherwise find no common history and roll back to 0.
    """
    out: list[FailoverEntry] = []
    for entry in log:
        if entry.uuid == 0 or entry.seqno < 0:
            continue
        if out and entry.seqno > out[-1].seqno:
            continue
        out.append(entry)
    return tuple(out)


def encode(log: FailoverLog) -> bytes:
    """Compact storage form: 16 bytes (uuid, seqno big-endian) per entry, newest first."""
    return b"".join(_ENTRY.pack(e.uuid, e.seqno) for e in log)


def decode(raw: bytes) -> FailoverLog:
    """Inverse of ``encode``; truncated trailing bytes are dropped and the log sanitised."""
    usable = len(raw) - len(raw) % _ENTRY.size
    entries = (FailoverEntry(u, s) for u, s in _ENTRY.iter_unpack(raw[:usable]))
    return sanitise(entries)
