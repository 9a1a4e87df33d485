"""``POST /cluster/rebalance`` refuses a body etcd could not take in one transaction (a node both
removed and added, too many names) with 422 before it reaches etcd, which would answer the first
with "duplicate key given in txn request" and the second with "too many operations"."""
from __future__ import annotations

import httpx
import pytest


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"remove": ["n3"], "add": ["n3"]}, "add"),
        ({"remove": [f"n{i}" for i in range(40)], "add": [f"m{i}" for i in range(40)]}, "remove"),
        ({"remove": [f"n{i}" for i in range(64)]}, None),
    ],
)
async def test_a_body_etcd_cannot_take_is_refused(asgi_client: httpx.AsyncClient, body: dict, field: str | None) -> None:
    r = await asgi_client.post("/cluster/rebalance", json=body)
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
    if field is not None:
        assert r.json()["field"] == field
