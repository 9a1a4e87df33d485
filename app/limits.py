"""Every request body is read under a size limit, enforced while it streams in.

WHY in the ASGI ``receive`` path rather than per route: a route that lets FastAPI parse its
body (``POST /positions/check``, ``/admin/...``) would otherwise buffer whatever the client
sends before any check runs (a 300 MiB body took a server from 193 MiB to over 1 GiB RSS).
``BodyLimit`` wraps ``receive`` for every HTTP request: a declared ``Content-Length`` over the
limit is refused before one body byte is read, and a chunked body as soon as the running total
passes it, so no client can make the server hold more than the limit (plus one chunk) of body.

Each request starts with the general limit (``max_request_bytes``); a route that takes larger
bodies raises its own limit before reading (``read_body``: a document value, a bulk body).
The limit travels in the ASGI scope, which the routing shares with the endpoint.
"""
from __future__ import annotations

from fastapi import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.problems import INVALID_INPUT, TOO_LARGE, Problem

#: scope key: ``(limit in bytes, what the body is)`` for the current request
BODY_LIMIT = "upr.body_limit"


class BodyTooLarge(HTTPException):
    """Raised from ``receive``; carries the 413 problem to answer with.

    WHY an ``HTTPException``: FastAPI turns any other exception raised while it reads a body
    into a 400 "error parsing the body", but lets its own ``HTTPException`` through."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.status, problem.detail)
        self.problem = problem


def too_large(what: str, limit: int, seen: str) -> Problem:
    return Problem(TOO_LARGE, f"{what} is {seen}; the limit is {limit} bytes", field="body", extra={"limit": limit})


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise Problem(INVALID_INPUT, "Content-Length is not an integer", field="header.content-length") from None
            if length < 0:
                raise Problem(INVALID_INPUT, "Content-Length is negative", field="header.content-length")
            return length
    return None


class BodyLimit:
    """ASGI middleware: each HTTP request's body is refused with 413 once over its limit."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, limited(scope, receive, self.limit), send)


def limited(scope: Scope, receive: Receive, limit: int) -> Receive:
    """``receive`` under ``limit`` (or the one a route sets in ``scope[BODY_LIMIT]`` later)."""
    scope[BODY_LIMIT] = (limit, "the request body")
    seen = -1  # -1: nothing read yet, so the declared length is still to be checked

    async def limited_receive() -> Message:
        nonlocal seen
        limit, what = scope[BODY_LIMIT]
        if seen < 0:
            declared = _declared_length(scope)
            if declared is not None and declared > limit:
                raise BodyTooLarge(too_large(what, limit, f"{declared} bytes"))
            seen = 0
        message = await receive()
        body = message.get("body")
        if body:
            seen += len(body)
            if seen > limit:
                raise BodyTooLarge(too_large(what, limit, f"over {seen} bytes"))
        return message

    return limited_receive


async def read_body(request: Request, limit: int, what: str = "request body") -> bytes:
    """The whole body under ``limit`` (instead of the general one), or ``BodyTooLarge`` (413)
    as soon as it is known to exceed it."""
    request.scope[BODY_LIMIT] = (limit, what)
    return await request.body()
