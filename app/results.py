"""Turning engine results into response bodies and headers.

Hand-written dicts rather than pydantic objects: these run once per write (thousands of
times per bulk request), and the shapes match ``app.models.WriteResult`` and
``BulkItemResult``, which a test checks against live responses.
"""
from __future__ import annotations

from typing import Any

from engine.core.types import Document, WriteResult


def write_result_dict(res: WriteResult, durability: str) -> dict[str, Any]:
    return {
        "key": res.key, "partition": res.partition, "seqno": res.seqno, "cas": res.cas,
        "rev": res.rev, "deleted": res.deleted, "durability": durability,
    }


def version_headers(res: WriteResult | Document) -> dict[str, str]:
    """Headers that let a writer ask later "has my write been streamed?" without the body."""
    return {
        "ETag": f'"{res.cas}"',
        "X-Upr-Cas": str(res.cas),
        "X-Upr-Seqno": str(res.seqno),
        "X-Upr-Partition": str(res.partition),
        "X-Upr-Rev": str(res.rev),
    }
