"""The check every HTTP error test makes: an RFC 9457 problem with our type URI and fields."""
from __future__ import annotations

from typing import Any

import httpx

PROBLEM = "application/problem+json"


def problem(r: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """Assert ``r`` is the problem ``slug`` with ``status``; return its body for further checks."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["type"] == f"https://upr.dev/problems/{slug}"
    assert body["status"] == status and body["title"] and body["detail"]
    return body
