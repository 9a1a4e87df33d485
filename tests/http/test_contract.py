"""The published contract says what the server does: integer bounds are integers, typed fields
are not coerced, and a bad bulk item is named by a correct JSON path."""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from app.cli import openapi_text
from engine.core.types import MAX_SEQNO


def _integer_schemas(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if node.get("type") == "integer":
            found.append(node)
        for value in node.values():
            found += _integer_schemas(value)
    elif isinstance(node, list):
        for value in node:
            found += _integer_schemas(value)
    return found


def test_integer_bounds_are_published_as_exact_integers() -> None:
    spec = json.loads(openapi_text())
    schemas = _integer_schemas(spec)
    bounds = [(s, k) for s in schemas for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in s]
    assert bounds
    assert all(type(s[k]) is int for s, k in bounds), [s for s, k in bounds if type(s[k]) is not int]
    uuid = spec["components"]["schemas"]["HeldPosition"]["properties"]["uuid"]
    assert uuid["maximum"] == MAX_SEQNO  # exactly 2**64 - 1, not a float that rounds to 2**64
    assert "1.8446744073709552e+19" not in openapi_text()


_POSITION = {"partition": 0, "uuid": 0, "seqno": 0, "snap_start": 0, "snap_end": 0}


@pytest.mark.parametrize("field, value", [
    ("strict_uuid", 0), ("strict_uuid", 1), ("strict_uuid", "false"), ("strict_uuid", None),
    ("uuid", "1"), ("uuid", True), ("seqno", 1.5), ("partition", "0"), ("snap_end", MAX_SEQNO + 1),
])
async def test_position_fields_are_not_coerced(inproc: httpx.AsyncClient, field: str, value: object) -> None:
    r = await inproc.post("/positions/check", json={"positions": [{**_POSITION, field: value}]})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert field in r.text


async def test_position_accepts_the_published_extremes(inproc: httpx.AsyncClient) -> None:
    pos = {**_POSITION, "uuid": MAX_SEQNO, "strict_uuid": True, "end_seqno": MAX_SEQNO}
    r = await inproc.post("/positions/check", json={"positions": [pos, {**_POSITION, "snap_end": 0.0}]})
    assert r.status_code == 200, r.text
    assert [v["status"] for v in r.json()["results"]] == ["rollback", "ok"]


@pytest.mark.parametrize("body, field", [
    (b"[[null, null]]", "[0]"),
    (b'[{"op": "set", "key": "a", "value": 1}, 7]', "[1]"),
    (b'[{"op": "set", "key": "a", "value": 1, "ttl": 5}]', "[0]"),
    (b'[{"op": "set", "key": 5, "value": 1}]', "[0].key"),
])
async def test_bulk_item_error_names_the_item(inproc: httpx.AsyncClient, body: bytes, field: str) -> None:
    r = await inproc.post("/docs/_bulk", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    errors = [res for res in r.json()["results"] if res["status"] != 200]
    assert [e["error"]["field"] for e in errors] == [field]
