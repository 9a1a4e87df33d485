"""Route logic in-process: the real app and a real LMDB engine behind ``httpx.ASGITransport``.

No subprocess, no socket: these checks are about what a route answers (status, problem type,
headers, body), which the server process adds nothing to.  Process-level behaviour (uvicorn
limits, signals, crashes, streams) stays in the tests that start a real server.
"""
from __future__ import annotations

import httpx
import pytest

from tests.support.asgi import in_process_app
from tests.support.keys import PARTITIONS, key_in
from tests.support.problems import problem


async def test_the_app_runs_its_lifespan_in_process(asgi_client: httpx.AsyncClient) -> None:
    assert (await asgi_client.get("/health")).status_code == 200
    assert (await asgi_client.get("/ready")).status_code == 200
    parts = (await asgi_client.get("/partitions")).json()["partitions"]
    assert [p["partition"] for p in parts] == list(range(PARTITIONS))


async def test_write_then_read_carries_the_version_headers(asgi_client: httpx.AsyncClient) -> None:
    key = key_in(3, "inproc")
    w = await asgi_client.put(f"/docs/{key}", content=b"v1")
    assert w.status_code == 200, w.text
    body = w.json()
    assert (body["partition"], body["rev"], body["deleted"]) == (3, 1, False)
    g = await asgi_client.get(f"/docs/{key}")
    assert g.content == b"v1" and g.headers["etag"] == f'"{body["cas"]}"'
    assert (int(g.headers["x-upr-partition"]), int(g.headers["x-upr-seqno"])) == (3, body["seqno"])


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "slug", "field"),
    [
        ("GET", "/docs/never-written", {}, 404, "key-not-found", None),
        ("DELETE", "/docs/never-written", {}, 404, "key-not-found", None),
        ("GET", "/no/such/route", {}, 404, "not-found", None),
        ("PATCH", "/docs/a", {}, 405, "method-not-allowed", None),
        ("PUT", "/docs/" + "k" * 251, {}, 422, "invalid-key", "key"),
        ("PUT", "/docs/a?durability=sometimes", {}, 422, "invalid-input", "query.durability"),
        ("PUT", "/docs/a", {"If-Match": "soon"}, 422, "invalid-input", "header.if-match"),
        ("PUT", "/docs/never", {"If-Match": '"5"'}, 412, "cas-mismatch", None),
        ("GET", "/partitions/-1", {}, 422, "invalid-input", None),
        ("GET", "/partitions/abc", {}, 422, "invalid-input", None),
    ],
)
async def test_refusals_are_typed_problems(asgi_client: httpx.AsyncClient, method: str, path: str,
                                           headers: dict[str, str], status: int, slug: str,
                                           field: str | None) -> None:
    r = await asgi_client.request(method, path, content=b"x" if method in ("PUT", "PATCH") else None,
                                  headers=headers)
    body = problem(r, status, slug)
    if field is not None:
        assert body["field"] == field


async def test_a_stale_cas_changes_nothing(asgi_client: httpx.AsyncClient) -> None:
    first = (await asgi_client.put("/docs/cas-doc", content=b"v1")).json()
    second = await asgi_client.put("/docs/cas-doc", content=b"v2", headers={"If-Match": f'"{first["cas"]}"'})
    assert second.status_code == 200
    stale = await asgi_client.put("/docs/cas-doc", content=b"v3", headers={"If-Match": f'"{first["cas"]}"'})
    body = problem(stale, 412, "cas-mismatch")
    assert (body["expected_cas"], body["actual_cas"]) == (first["cas"], second.json()["cas"])
    assert (await asgi_client.get("/docs/cas-doc")).content == b"v2"


async def test_settings_reach_the_routes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with in_process_app(tmp_path / "data", max_value_bytes=8) as app:
        assert (await app.client.put("/docs/small", content=b"12345678")).status_code == 200
        problem(await app.client.put("/docs/big", content=b"123456789"), 413, "too-large")
