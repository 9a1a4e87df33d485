"""Reading a request body under a size limit.

WHY not ``await request.body()``: it buffers whatever the client sends.  Here a
declared ``Content-Length`` over the limit is refused before one body byte is read,
and a chunked body is refused as soon as the running total passes the limit, so a
client can never make the server hold more than ``limit`` bytes (plus one chunk).
"""
from __future__ import annotations

from starlette.requests import Request

from app.problems import INVALID_INPUT, TOO_LARGE, Problem


def declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise Problem(INVALID_INPUT, "Content-Length is not an integer", field="header.content-length") from None
    if value < 0:
        raise Problem(INVALID_INPUT, "Content-Length is negative", field="header.content-length")
    return value


def too_large(what: str, limit: int, seen: str) -> Problem:
    return Problem(TOO_LARGE, f"{what} is {seen}; the limit is {limit} bytes", field="body", extra={"limit": limit})


async def read_body(request: Request, limit: int, what: str = "request body") -> bytes:
    """The whole body, or ``Problem(413)`` as soon as it is known to exceed ``limit``."""
    length = declared_length(request)
    if length is not None and length > limit:
        raise too_large(what, limit, f"{length} bytes")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        if not chunk:
            continue
        total += len(chunk)
        if total > limit:
            raise too_large(what, limit, f"over {total} bytes")
        chunks.append(chunk)
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)
