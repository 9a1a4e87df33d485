"""``app.plain.serve_plainly``: what it refuses to serve, and that the document routes use it."""
from __future__ import annotations

import pytest
from fastapi import APIRouter, BackgroundTasks, Depends
from starlette.requests import Request
from starlette.responses import Response

from app.auth import TokenTable
from app.plain import serve_plainly
from app.settings import Settings


async def _with_query(request: Request, limit: int = 1) -> None: ...


async def _with_response(request: Request, response: Response) -> None: ...


async def _with_tasks(request: Request, tasks: BackgroundTasks) -> None: ...


def _sync(request: Request) -> None: ...


async def _no_request() -> None: ...


@pytest.mark.parametrize("endpoint", [_with_query, _with_response, _with_tasks, _sync, _no_request])
def test_serve_plainly_refuses_what_it_cannot_serve(endpoint: object) -> None:
    """A route served plainly gets no dependency solving and no thread pool, so an endpoint
    that declares anything but the request (or is not ``async``) would fail at request time:
    it is refused when the route is set up."""
    router = APIRouter()
    router.add_api_route("/x", endpoint, methods=["GET"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must (take only the Request|be an async def)"):
        serve_plainly(router.routes)


def test_serve_plainly_refuses_router_dependencies() -> None:
    async def needs(request: Request) -> None: ...

    async def endpoint(request: Request) -> None: ...

    router = APIRouter(dependencies=[Depends(needs)])
    router.add_api_route("/x", endpoint, methods=["GET"])
    with pytest.raises(TypeError, match="no dependencies"):
        serve_plainly(router.routes)


def test_document_routes_are_served_plainly_in_the_app() -> None:
    """Checked on the app's own routes (an ``include_router`` would copy the routes and drop the swap)."""
    from app.main import create_app

    app = create_app(Settings.model_construct(), tokens=TokenTable())
    docs = [r for r in app.routes if getattr(r, "path", "") == "/docs/{key:doc_key}"]
    assert sorted(m for r in docs for m in r.methods) == ["DELETE", "GET", "PUT"]
    assert {r.app.__qualname__ for r in docs} == {"plain.<locals>.app"}
