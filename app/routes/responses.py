"""OpenAPI declarations of the problem responses a route can give."""
from __future__ import annotations

from typing import Any

from app.models import Problem
from app.problems import PROBLEM_MEDIA_TYPE

_DESCRIPTIONS = {
    401: "missing or unknown bearer token",
    403: "the token's role is not sufficient",
    404: "unknown key or partition",
    409: "CAS mismatch (bulk item)",
    412: "CAS mismatch (If-Match)",
    413: "body, value or batch over its limit",
    415: "unsupported media type",
    416: "seqno out of range",
    422: "invalid input; `field` names it",
    429: ("write queue over its memory limit, or over `--flush-failure-backlog-bytes` while flushing to disk "
          "fails; nothing was written; retry after Retry-After"),
    503: ("partition not active (see `partition`) or engine not open; or `durability-impossible`: too few live "
          "copies of the partition to form a majority, nothing was written"),
    504: ("`durability-ambiguous`: a majority/persist_majority write was applied on the active but not confirmed "
          "by a majority of the partition's copies within `durability_timeout_ms`; it may or may not survive a "
          "failover (`partition`, `seqno`, `node` name it); read it back or rewrite it (idempotent sets are safe)"),
    507: ("the disk is full: the writes waited for (durability=persist, or a flush) were applied and stay queued "
          "in memory, but are not persisted yet; the server persists them by itself once space returns (do not "
          "resend them). `unpersisted` lists each partition and the seqno waited for"),
}


#: Where a route's meaning of a status differs from the usual one above.
DISK_FULL_NOTHING_CHANGED = ("the disk is full: this change is written straight to disk and was refused whole "
                             "(`disk-full`, `applied: false`); retry once space returns")


def problems(*statuses: int, described: dict[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the problem statuses a route answers; ``described`` overrides the
    usual description of a status for this route."""
    described = described or {}
    return {
        status: {
            "model": Problem,
            "description": described.get(status, _DESCRIPTIONS[status]),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }
