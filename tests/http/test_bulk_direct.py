"""``POST /docs/_bulk`` through ``app.fast_bulk.BulkFastPath`` answers exactly as the full stack
does: the same requests sent to two apps on fresh engines, one taking the direct path and one
forced through the framework's layers (a dependency override turns the direct path off), give
the same status, media type, headers that matter and body (CAS values aside: they are clocks)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from app.auth import Role, TokenTable
from app.deps import write_ctx
from app.fast_bulk import BulkFastPath
from tests.support.asgi import in_process_app

TOKENS = TokenTable([("reader", Role.READ, "r"), ("writer", Role.WRITE, "w")])
W = {"Authorization": "Bearer writer"}
ITEMS = [{"op": "set", "key": f"k{i}", "value": {"i": i}} for i in range(3)]

# (query, headers, body)
REQUESTS: list[tuple[str, dict[str, str], bytes]] = [
    ("", W, orjson.dumps(ITEMS)),
    ("", W, orjson.dumps([{"op": "set", "key": "k0", "value": 1, "cas": 1}, {"op": "delete", "key": "k1"},
                          {"op": "bogus", "key": "x"}])),
    ("?results=columns", W, orjson.dumps(ITEMS)),
    ("", {**W, "Content-Type": "application/x-ndjson"}, b'{"op":"set","key":"n","value":2}\n{"op":"delete","key":"n"}\n'),
    ("?durability=persist", W, orjson.dumps(ITEMS)),
    ("?durability=nope", W, orjson.dumps(ITEMS)),
    ("?durability=majority", W, orjson.dumps(ITEMS)),  # no cluster: what a single node answers
    ("", W, b"[{"),
    ("", W, b"{}"),
    ("", W, orjson.dumps([{"op": "set", "key": f"m{i}", "value": i} for i in range(5)])),  # over max_bulk_items
    ("", W, b"[" + b" " * 5000 + b"]"),  # over max_bulk_bytes
    ("", {}, orjson.dumps(ITEMS)),  # no token
    ("", {"Authorization": "Bearer reader"}, orjson.dumps(ITEMS)),  # wrong role
    ("", {"Authorization": "Bearer nobody"}, orjson.dumps(ITEMS)),
]


def _without_cas(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_cas(v) for k, v in value.items() if k not in ("cas", "actual_cas")}
    if isinstance(value, list):
        return [_without_cas(v) for v in value]
    return value


def _direct_layer(app: Any) -> BulkFastPath:
    layer = app.middleware_stack
    while not isinstance(layer, BulkFastPath):
        layer = layer.app
    return layer


async def _answers(data_dir: Path, full_stack: bool) -> tuple[list[Any], int]:
    async with in_process_app(data_dir, tokens=TOKENS, max_bulk_items=4, max_bulk_bytes=4096) as running:
        if full_stack:
            running.app.dependency_overrides[write_ctx] = write_ctx
        out = []
        for query, headers, body in REQUESTS:
            r = await running.client.post(f"/docs/_bulk{query}", content=body, headers=headers)
            try:
                payload = _without_cas(r.json())
            except ValueError:
                payload = r.text
            out.append((query, body[:40], r.status_code, r.headers.get("content-type"),
                        r.headers.get("www-authenticate"), payload))
        metrics = (await running.client.get("/metrics", headers=W)).text
        counted = [line for line in metrics.splitlines()
                   if line.startswith("upr_http_requests_total{") and "/docs/_bulk" in line]
        out.append(sorted(counted))
        out.append(sorted(line for line in metrics.splitlines() if line.startswith("upr_bulk_items_total{")))
        return out, _direct_layer(running.app).answered


@pytest.mark.asyncio
async def test_the_direct_path_answers_as_the_full_stack(tmp_path: Path) -> None:
    direct, answered = await _answers(tmp_path / "direct", full_stack=False)
    full, bypassed = await _answers(tmp_path / "full", full_stack=True)
    assert answered == len(REQUESTS) and bypassed == 0
    for got, expected in zip(direct, full):
        assert got == expected
    assert {entry[2] for entry in direct[:-2]} >= {200, 401, 403, 413, 422}
    outcomes = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in direct[-1]}
    assert outcomes["ok"] >= 11 and outcomes["failed"] >= 2  # each app counts its own items
    assert direct[-2], "the requests counted by route and status"
