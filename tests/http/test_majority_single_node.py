"""``majority`` and ``persist_majority`` on a single node (no --cluster): a majority of one copy is
the node itself, so they behave as ``memory`` and ``persist`` and say which level was asked for;
``durability_timeout_ms`` is checked at every level."""
from __future__ import annotations

import httpx
import pytest

from app.params import durability_timeout_of
from app.problems import Problem
from starlette.requests import Request
from tests.support.keys import key_in
from tests.support.problems import problem


@pytest.mark.parametrize("level", ["majority", "persist_majority"])
def test_single_document_writes_at_majority_levels(client: httpx.Client, level: str) -> None:
    key = key_in(3, level)
    w = client.put(f"/docs/{key}", params={"durability": level}, content=b"v")
    assert w.status_code == 200 and w.json()["durability"] == level
    if level == "persist_majority":  # persist on the one copy there is
        assert client.get("/partitions/3").json()["persisted_seqno"] >= w.json()["seqno"]
    d = client.delete(f"/docs/{key}", params={"durability": level, "durability_timeout_ms": "50"})
    assert d.status_code == 200 and d.json()["durability"] == level and d.json()["deleted"] is True


@pytest.mark.parametrize("level", ["majority", "persist_majority"])
def test_bulk_at_majority_levels(client: httpx.Client, level: str) -> None:
    ops = [{"op": "set", "key": f"bulk-{level}-{i}", "value": i} for i in range(20)]
    r = client.post("/docs/_bulk", params={"durability": level}, json=ops)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["durability"] == level and body["succeeded"] == 20
    if level == "persist_majority":
        for item in body["results"]:
            assert client.get(f"/partitions/{item['partition']}").json()["persisted_seqno"] >= item["seqno"]


@pytest.mark.parametrize("timeout", ["0", "-1", "abc", "60001", "1.5", "١٢"])
def test_bad_durability_timeouts_are_refused_and_write_nothing(client: httpx.Client, timeout: str) -> None:
    key = key_in(1, "timeout-" + timeout)
    for r in (client.put(f"/docs/{key}", params={"durability": "majority", "durability_timeout_ms": timeout},
                         content=b"x"),
              client.put(f"/docs/{key}", params={"durability_timeout_ms": timeout}, content=b"x"),
              client.post("/docs/_bulk", params={"durability_timeout_ms": timeout},
                          json=[{"op": "set", "key": key, "value": 1}])):
        assert problem(r, 422, "invalid-input")["field"] == "query.durability_timeout_ms"
    problem(client.get(f"/docs/{key}"), 404, "key-not-found")


@pytest.mark.parametrize(
    ("query", "seconds"),
    [(b"", 10.0), (b"durability=majority", 10.0), (b"durability_timeout_ms=250", 0.25),
     (b"durability=persist_majority&durability_timeout_ms=60000", 60.0), (b"x=1", 10.0)],
)
def test_durability_timeout_parameter(query: bytes, seconds: float) -> None:
    request = Request({"type": "http", "method": "PUT", "path": "/docs/a", "headers": [], "query_string": query})
    assert durability_timeout_of(request, 10_000) == seconds


def test_unknown_level_names_all_four(client: httpx.Client) -> None:
    body = problem(client.put("/docs/a", params={"durability": "quorum"}, content=b"x"), 422, "invalid-input")
    assert "persist_majority" in body["detail"]
    with pytest.raises(Problem):
        durability_timeout_of(Request({"type": "http", "method": "PUT", "path": "/docs/a", "headers": [],
                                       "query_string": b"durability_timeout_ms=0"}), 10_000)
