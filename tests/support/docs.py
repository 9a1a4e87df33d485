"""Writing documents over HTTP and folding received events into a dict, for client tests."""
from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any

import httpx

from clients import Deletion, Mutation


def bulk(url: str, ops: Sequence[dict[str, Any]], durability: str = "memory", *,
         headers: dict[str, str] | None = None, chunk: int | None = None,
         ok_statuses: Container[int] | None = None, timeout: float = 120) -> list[dict[str, Any]]:
    """``POST /docs/_bulk`` (in requests of ``chunk`` items when given); asserts every request
    answered 200 and, with ``ok_statuses``, that every item's status is one of them (a delete of
    an absent key is a 404 item).  Returns the per-item results in order."""
    step = chunk or max(len(ops), 1)
    batches = [list(ops[i:i + step]) for i in range(0, len(ops), step)] or [[]]
    results: list[dict[str, Any]] = []
    with httpx.Client(timeout=timeout, headers=headers) as client:
        for batch in batches:
            r = client.post(f"{url}/docs/_bulk", params={"durability": durability}, json=batch)
            assert r.status_code == 200, r.text[:500]
            items = r.json()["results"]
            if ok_statuses is not None:
                bad = [x for x in items if x["status"] not in ok_statuses]
                assert not bad, bad[:3]
            results += items
    return results


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
