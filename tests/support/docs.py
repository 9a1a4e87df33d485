"""Writing documents over HTTP and folding received events into a dict, for client tests."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from clients import Deletion, Mutation


def bulk(url: str, ops: list[dict[str, Any]], durability: str = "memory",
         headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``POST /docs/_bulk``; asserts 200 and returns the per-item results."""
    r = httpx.post(f"{url}/docs/_bulk", params={"durability": durability}, json=ops, timeout=30, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["results"]


def sets(prefix: str, n: int, tag: str = "v") -> list[dict[str, Any]]:
    """``n`` set operations on keys ``{prefix}0..``, values ``{tag}0..``."""
    return [{"op": "set", "key": f"{prefix}{i}", "value": f"{tag}{i}"} for i in range(n)]


def apply(events: Iterable[object], docs: dict[str, bytes]) -> None:
    """Fold a consumer's mutations and deletions into ``docs`` (other events are not data)."""
    for ev in events:
        if isinstance(ev, Mutation):
            docs[ev.key] = ev.value
        elif isinstance(ev, Deletion):
            docs.pop(ev.key, None)
