"""Correcting keys after a rollback (``onRollback=refetch``), as UPR's client ring buffer does.

The keys whose index rows (or no-entry markers) came from seqnos above the rollback seqno R may
now hold other values, or be alive again after a lost deletion: fetch each one's current version
by GET and apply it as an ordinary change.  A key the server no longer has becomes a deletion at
seqno R, so anything the stream delivers after R still wins.
"""
from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote

import httpx

Row = tuple[str, int, int, str, bytes | None]   # key, partition, seqno, op, value


def refetch(server: str, token: str | None, keys: Iterable[tuple[str, int, int]], timeout: float = 30.0) -> list[Row]:
    """``keys``: (key, partition, rollback seqno R).  Returns one correction row per key."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    out: list[Row] = []
    with httpx.Client(base_url=server, headers=headers, timeout=timeout) as http:
        for key, partition, rollback_seqno in keys:
            resp = http.get("/docs/" + quote(key, safe=""))
            if resp.status_code == 404:
                out.append((key, partition, rollback_seqno, "deletion", None))
            elif resp.status_code == 200:
                seqno = int(resp.headers.get("x-upr-seqno", rollback_seqno))
                out.append((key, partition, seqno, "mutation", resp.content))
            else:
                raise RuntimeError(f"refetch of {key!r} after a rollback got HTTP {resp.status_code}: "
                                   f"{resp.text[:200]}")
    return out
