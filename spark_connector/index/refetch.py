"""Correcting keys after a rollback (``onRollback=refetch``), as UPR's client ring buffer does.

The keys whose index rows (or no-entry markers) came from seqnos above the rollback seqno R may
now hold other values, or be alive again after a lost deletion: fetch each one's current version
by GET and apply it as an ordinary change.  A key the server no longer has becomes a deletion at
seqno R, so anything the stream delivers after R still wins.
"""
from __future__ import annotations

from collections.abc import Iterable

from clients.http import HttpApi

Row = tuple[str, int, int, str, bytes | None]   # key, partition, seqno, op, value


def refetch(server: str, token: str | None, keys: Iterable[tuple[str, int, int]], timeout: float = 30.0) -> list[Row]:
    """``keys``: (key, partition, rollback seqno R).  Returns one correction row per key."""
    out: list[Row] = []
    with HttpApi(server, token, timeout=timeout) as api:
        for key, partition, rollback_seqno in keys:
            doc = api.get(key)
            if doc is None:
                out.append((key, partition, rollback_seqno, "deletion", None))
            else:
                out.append((key, partition, doc.seqno, "mutation", doc.value))
    return out
