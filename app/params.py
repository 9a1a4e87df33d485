"""Query, header and path parameters of the document routes, read by hand.

WHY by hand: FastAPI's per-request parameter machinery was the largest single cost of
a single-document write (measured ~20% of its CPU for one query and one header).  These
helpers do the same checks with the same problem documents (field ``query.durability``,
``header.if-match``), and the ``*_PARAM`` dicts declare them in the OpenAPI document.
"""
from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request

from app.problems import INVALID_INPUT, Problem
from engine.core.types import Durability

_DURABILITY = {"memory": Durability.MEMORY, "persist": Durability.PERSIST}
_CAS = re.compile(r'\s*("?)([1-9][0-9]{0,19})\1\s*')
_MAX_CAS = 1 << 64

KEY_PARAM: dict[str, Any] = {
    "name": "key", "in": "path", "required": True,
    "description": "document key: any UTF-8 text up to the key limit (percent-encode reserved characters)",
    "schema": {"type": "string"},
}
DURABILITY_PARAM: dict[str, Any] = {
    "name": "durability", "in": "query", "required": False,
    "description": "memory: answer once queued; persist: answer once fsynced",
    "schema": {"type": "string", "enum": ["memory", "persist"], "default": "memory"},
}
RESULTS_PARAM: dict[str, Any] = {
    "name": "results", "in": "query", "required": False,
    "description": "objects: `results`, one object per item; columns: `columns` (one array per field, element i "
                   "for item i) and `errors` (the failed items), far cheaper for large batches",
    "schema": {"type": "string", "enum": ["objects", "columns"], "default": "objects"},
}
IF_MATCH_PARAM: dict[str, Any] = {
    "name": "If-Match", "in": "header", "required": False,
    "description": 'CAS the document must currently have, as returned in ETag ("123" or 123)',
    "schema": {"type": "string", "pattern": r'^\s*("[1-9][0-9]{0,19}"|[1-9][0-9]{0,19})\s*$'},
}


#: whole query strings that say only the durability: answered without parsing the query
_DURABILITY_QUERY = {b"durability=" + k.encode(): v for k, v in _DURABILITY.items()}


def durability_of(request: Request) -> Durability:
    query = request.scope.get("query_string", b"")
    if not query:
        return Durability.MEMORY
    found = _DURABILITY_QUERY.get(query)  # the common case: Starlette's query parsing is ~5 % of a PUT
    if found is not None:
        return found
    raw = request.query_params.get("durability")
    if raw is None:
        return Durability.MEMORY
    found = _DURABILITY.get(raw)
    if found is None:
        raise Problem(INVALID_INPUT, "durability must be memory or persist", field="query.durability")
    return found


def columns_wanted(request: Request) -> bool:
    """``?results=columns`` (True) or ``objects``/absent (False)."""
    raw = request.query_params.get("results")
    if raw is None or raw == "objects":
        return False
    if raw == "columns":
        return True
    raise Problem(INVALID_INPUT, "results must be objects or columns", field="query.results")


def parse_if_match(value: str | None) -> int | None:
    """The CAS in an ``If-Match`` header (quoted or bare decimal), or None when absent.

    CAS values are never 0, so ``"0"`` is refused rather than read as "no check"."""
    if value is None:
        return None
    m = _CAS.fullmatch(value)
    if m is None or int(m.group(2)) >= _MAX_CAS:
        raise Problem(INVALID_INPUT, 'If-Match must be a CAS as returned in ETag, e.g. "1234"', field="header.if-match")
    return int(m.group(2))


def if_match_of(request: Request) -> int | None:
    return parse_if_match(request.headers.get("if-match"))


def key_of(request: Request) -> str:
    return request.path_params["key"]  # type: ignore[no-any-return]
