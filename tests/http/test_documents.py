"""Documents end to end against a real server: writes, reads, CAS, errors as problem+json."""
from __future__ import annotations

import httpx
import pytest

from tests.support.keys import PARTITIONS, key_in
from tests.support.problems import problem

pytestmark = pytest.mark.slow

def test_put_get_roundtrip_with_version_headers(client: httpx.Client) -> None:
    value = bytes(range(256)) * 3
    r = client.put("/docs/user/42", content=value, headers={"content-type": "image/png"})
    assert r.status_code == 200
    w = r.json()
    assert w["key"] == "user/42" and w["rev"] == 1 and w["deleted"] is False and w["durability"] == "memory"
    assert 0 <= w["partition"] < PARTITIONS and w["seqno"] >= 1
    assert r.headers["etag"] == f'"{w["cas"]}"'
    g = client.get("/docs/user/42")
    assert g.status_code == 200 and g.content == value
    assert g.headers["etag"] == f'"{w["cas"]}"'
    assert (int(g.headers["x-upr-seqno"]), int(g.headers["x-upr-partition"]), int(g.headers["x-upr-rev"])) == (
        w["seqno"], w["partition"], 1)


def test_seqnos_grow_per_partition(client: httpx.Client) -> None:
    key = key_in(5, "grow")
    seqnos = [client.put(f"/docs/{key}", content=b"v").json()["seqno"] for _ in range(3)]
    assert seqnos == sorted(seqnos) and len(set(seqnos)) == 3
    assert client.get(f"/partitions/5").json()["high_seqno"] >= seqnos[-1]


def test_cas_conflicts(client: httpx.Client) -> None:
    first = client.put("/docs/cas-doc", content=b"v1").json()
    second = client.put("/docs/cas-doc", content=b"v2", headers={"If-Match": f'"{first["cas"]}"'})
    assert second.status_code == 200 and second.json()["rev"] == 2
    stale = client.put("/docs/cas-doc", content=b"v3", headers={"If-Match": f'"{first["cas"]}"'})
    body = problem(stale, 412, "cas-mismatch")
    assert body["expected_cas"] == first["cas"] and body["actual_cas"] == second.json()["cas"]
    assert body["partition"] == first["partition"]
    assert client.get("/docs/cas-doc").content == b"v2"
    bad_delete = client.delete("/docs/cas-doc", headers={"If-Match": str(first["cas"])})
    problem(bad_delete, 412, "cas-mismatch")
    ok_delete = client.delete("/docs/cas-doc", headers={"If-Match": second.headers["etag"]})
    assert ok_delete.status_code == 200 and ok_delete.json()["deleted"] is True
    problem(client.put("/docs/never", content=b"x", headers={"If-Match": '"5"'}), 412, "cas-mismatch")


def test_not_found(client: httpx.Client) -> None:
    body = problem(client.get("/docs/nope-never-written"), 404, "key-not-found")
    assert 0 <= body["partition"] < PARTITIONS
    problem(client.delete("/docs/nope-never-written"), 404, "key-not-found")
    client.put("/docs/gone", content=b"x")
    client.delete("/docs/gone")
    problem(client.get("/docs/gone"), 404, "key-not-found")
    problem(client.get("/no/such/route"), 404, "not-found")


def test_invalid_input(client: httpx.Client) -> None:
    body = problem(client.put("/docs/" + "k" * 251, content=b"x"), 422, "invalid-key")
    assert body["field"] == "key"
    body = problem(client.put("/docs/a?durability=sometimes", content=b"x"), 422, "invalid-input")
    assert body["field"] == "query.durability"
    body = problem(client.put("/docs/a", content=b"x", headers={"If-Match": "soon"}), 422, "invalid-input")
    assert body["field"] == "header.if-match"
    problem(client.get("/partitions/-1"), 422, "invalid-input")
    problem(client.get("/partitions/abc"), 422, "invalid-input")


def test_persist_durability_reports_persisted(client: httpx.Client) -> None:
    key = key_in(2, "persist")
    w = client.put(f"/docs/{key}?durability=persist", content=b"durable").json()
    assert w["durability"] == "persist"
    assert client.get("/partitions/2").json()["persisted_seqno"] >= w["seqno"]


def test_method_not_allowed_is_a_problem(client: httpx.Client) -> None:
    problem(client.patch("/docs/a", content=b"x"), 405, "method-not-allowed")


@pytest.mark.parametrize("key", ["a/b/c", "line\nbreak", "ünï cödé", "with?question", "%41"])
def test_any_utf8_key_roundtrips(client: httpx.Client, key: str) -> None:
    from urllib.parse import quote

    path = "/docs/" + quote(key, safe="")
    w = client.put(path, content=key.encode())
    assert w.status_code == 200 and w.json()["key"] == key
    assert client.get(path).content == key.encode()
