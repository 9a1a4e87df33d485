"""Serving a route's endpoint without FastAPI's per-request machinery.

WHY: the single-document routes (``PUT``/``GET``/``DELETE /docs/{key}``) take only the
``Request`` and build their own ``Response``: they read their parameters by hand
(``app.params``), their body under a limit (``app.limits``) and their context with
``app.deps.ctx_for``.  FastAPI still wrapped each call in its request handler: two
``AsyncExitStack``s, the endpoint-context and body-reading preamble, dependency solving for
the lone ``Request`` parameter, and an exception wrapper.  Routed through ``plain`` the
endpoint is called with a Starlette ``Request`` and its ``Response`` sent, nothing else.

What stays the same: the route is still a FastAPI ``APIRoute``, so it is matched, listed and
described in the OpenAPI document as before, and every middleware still runs.  An exception
an endpoint raises (``Problem``, an engine error) is turned into its problem document by the
app's exception handlers in Starlette's ``ExceptionMiddleware``, which sits outside the router.

Path parameters are decoded strictly.  The server decodes a path's percent-escapes with
replacement, so ``/docs/a%FEx``, ``/docs/a%FFx`` and ``/docs/a%EF%BF%BDx`` would all name the key
``a\ufffdx`` (one document, silently overwritten by the others).  A path holding U+FFFD is therefore
matched again from the raw bytes sent, each byte that is not UTF-8 kept as a lone surrogate
(``surrogateescape``), and the engine's key rule (``engine.core.keys``: valid UTF-8) refuses it
with 422 ``invalid-key``, as it refuses the same key in a bulk item.
"""
from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import unquote_to_bytes

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]


def plain(endpoint: Endpoint, route: APIRoute) -> ASGIApp:
    """An ASGI app that calls ``endpoint(request)`` and sends the response it returns."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if "\ufffd" in scope["path"]:
            scope["path_params"] = strict_path_params(route, scope)
        response = await endpoint(Request(scope, receive, send))
        await response(scope, receive, send)

    return app


def strict_path_params(route: APIRoute, scope: Scope) -> dict[str, object]:
    """``route``'s path parameters matched on the raw path, its percent-escapes decoded with
    ``surrogateescape`` instead of replacement: bytes that are not UTF-8 stay recognisable."""
    raw = scope.get("raw_path")
    if raw is None:
        return scope["path_params"]  # type: ignore[no-any-return]
    path = unquote_to_bytes(raw.split(b"?", 1)[0]).decode("utf-8", "surrogateescape")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    match = route.path_regex.match(path)
    if match is None:
        return scope["path_params"]  # type: ignore[no-any-return]
    return {name: route.param_convertors[name].convert(value) for name, value in match.groupdict().items()}


def serve_plainly(routes: Iterable[BaseRoute]) -> None:
    """Route each of ``routes`` through ``plain``.

    Each must be an ``APIRoute`` whose endpoint is an ``async def`` taking exactly one
    parameter, the ``Request``, with no route or router dependencies: anything else FastAPI
    would have injected (a query parameter, ``Response``, ``BackgroundTasks``...) or run in a
    thread pool (a plain ``def``) would fail at request time, so it is refused here."""
    for route in routes:
        if not isinstance(route, APIRoute):
            raise TypeError(f"{route!r} is not an APIRoute")
        endpoint = route.endpoint
        what = f"{route.path} {sorted(route.methods)}"
        if not inspect.iscoroutinefunction(endpoint):
            raise TypeError(f"{what}: its endpoint must be an async def")
        if len(inspect.signature(endpoint).parameters) != 1 or route.dependant.request_param_name is None \
                or route.dependant.dependencies:
            raise TypeError(f"{what}: its endpoint must take only the Request, with no dependencies")
        route.app = plain(endpoint, route)
