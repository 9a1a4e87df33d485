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

_DURABILITY = {d.value: d for d in Durability}
_CAS = re.compile(r'\s*("?)([1-9][0-9]{0,19})\1\s*')
_MAX_CAS = 1 << 64
#: the longest a durable write may hold its request (and its waiter) open
MAX_DURABILITY_TIMEOUT_MS = 60_000

KEY_PARAM: dict[str, Any] = {
    "name": "key", "in": "path", "required": True,
    "description": "document key: any UTF-8 text up to the key limit (percent-encode reserved characters)",
    "schema": {"type": "string"},
}
DURABILITY_PARAM: dict[str, Any] = {
    "name": "durability", "in": "query", "required": False,
    "description": "memory: answer once queued on the active; persist: once fsynced on the active; majority: once "
                   "a majority of the partition's copies (active and replicas of the current map) hold it in memory; "
                   "persist_majority: once a majority have persisted it, the active among them.  A majority write "
                   "not confirmed within `durability_timeout_ms` gets 504 `durability-ambiguous` (it may have been "
                   "applied); a single-document write for a partition with too few live copies to form a majority "
                   "gets 503 `durability-impossible` (not applied; a bulk batch, written before its partitions are "
                   "known, gets 504 at once).  On a single node (no --cluster) a majority is the "
                   "node itself: majority = memory, persist_majority = persist",
    "schema": {"type": "string", "enum": [d.value for d in Durability], "default": "memory"},
}
DURABILITY_TIMEOUT_PARAM: dict[str, Any] = {
    "name": "durability_timeout_ms", "in": "query", "required": False,
    "description": "how long a majority or persist_majority write waits for its copies before answering "
                   "504 durability-ambiguous (default --durability-timeout-ms, 10000 unless set)",
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_DURABILITY_TIMEOUT_MS},
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


#: the query parameters a document write takes, and a bulk write
WRITE_QUERY = frozenset({"durability", "durability_timeout_ms"})
BULK_QUERY = WRITE_QUERY | {"results"}


def durability_of(request: Request, known: frozenset[str] = WRITE_QUERY) -> Durability:
    """``?durability=`` of a write; any query parameter outside ``known`` is refused, since a
    misspelt ``durabilty=majority`` silently written at ``memory`` is the kind of surprise that
    loses a write on failover."""
    query = request.scope.get("query_string", b"")
    if not query:
        return Durability.MEMORY
    found = _DURABILITY_QUERY.get(query)  # the common case: Starlette's query parsing is ~5 % of a PUT
    if found is not None:
        return found
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise Problem(INVALID_INPUT, f"unknown query parameter {unknown[0]!r}; known: {', '.join(sorted(known))}",
                      field=f"query.{unknown[0]}")
    raw = request.query_params.get("durability")
    if raw is None:
        return Durability.MEMORY
    found = _DURABILITY.get(raw)
    if found is None:
        raise Problem(INVALID_INPUT, "durability must be memory, persist, majority or persist_majority",
                      field="query.durability")
    return found


def durability_timeout_of(request: Request, default_ms: int, max_ms: int = MAX_DURABILITY_TIMEOUT_MS) -> float:
    """``?durability_timeout_ms=`` in seconds (``default_ms`` when absent), 1 to ``max_ms``."""
    query = request.scope.get("query_string", b"")
    if not query or query in _DURABILITY_QUERY:  # the common cases, without parsing the query
        return default_ms / 1000
    raw = request.query_params.get("durability_timeout_ms")
    if raw is None:
        return default_ms / 1000
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= max_ms:
        raise Problem(INVALID_INPUT, f"durability_timeout_ms must be an integer from 1 to {max_ms}",
                      field="query.durability_timeout_ms")
    return int(raw) / 1000


def columns_wanted(request: Request) -> bool:
    """``?results=columns`` (True) or ``objects``/absent (False)."""
    raw = request.query_params.get("results")
    if raw is None or raw == "objects":
        return False
    if raw == "columns":
        return True
    raise Problem(INVALID_INPUT, "results must be objects or columns", field="query.results")


#: a bulk query's parsed form by its raw text and the timeout default (see ``bulk_query_of``)
_BULK_QUERIES: dict[tuple[bytes, int], tuple[Durability, float, bool]] = {}
#: distinct bulk queries remembered; past it a query is parsed every time (a client varying its
#: query cannot grow the table)
BULK_QUERIES_KEPT = 64


def bulk_query_of(request: Request, default_timeout_ms: int) -> tuple[Durability, float, bool]:
    """A bulk's durability, its timeout in seconds and whether it wants ``results=columns``:
    ``durability_of``, ``durability_timeout_of`` and ``columns_wanted`` in one, remembered by
    the query's raw text.

    WHY: a writer sends the same query with every bulk, and parsing it three times over was a
    few per cent of the event loop's CPU per small bulk (docs/benchmarks.md, Peers, "A node's
    CPU per small write request").  Only queries that parsed without a problem are kept, so a
    bad one is refused every time with its own message."""
    key = (request.scope.get("query_string", b""), default_timeout_ms)
    found = _BULK_QUERIES.get(key)
    if found is not None:
        return found
    found = (durability_of(request, BULK_QUERY), durability_timeout_of(request, default_timeout_ms),
             columns_wanted(request))
    if len(_BULK_QUERIES) < BULK_QUERIES_KEPT:
        _BULK_QUERIES[key] = found
    return found


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
