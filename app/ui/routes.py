"""Routes of the console: the page, its assets, and ``GET /ui/api/overview``."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from app.deps import ReadCtx
from app.problems import ENGINE_CLOSED, Problem
from app.routes.responses import problems
from app.ui.overview import build_overview

STATIC_DIR = Path(__file__).resolve().parent / "static"

#: the page loads nothing from another origin and runs no inline script: a value shown on it
#: (a stream name, an error text) can never become code
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter(tags=["status"])


async def console_page() -> Response:
    return FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS, media_type="text/html")


async def console_redirect() -> Response:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/api/overview", summary="Everything the console shows, read at one moment",
            response_class=Response, responses=problems(401, 403, 503))
async def overview(request: Request, ctx: ReadCtx) -> Response:
    """Node totals, recent rates, every partition (seqnos, backlog, failover log, state), every
    open stream (per-partition lag in seqnos and seconds, purge distance) and, in a cluster, the
    nodes and partition map; refreshed once a second."""
    ctx.runner  # 503 while the engine is not open
    monitor = getattr(request.app.state, "console_monitor", None)
    if monitor is None or monitor.reading is None:
        raise Problem(ENGINE_CLOSED, "the console monitor is not running (starting or shutting down)",
                      headers={"Retry-After": "1"})
    body = monitor.overview_json(lambda reading: build_overview(request.app, monitor, reading))
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


def install(app: FastAPI) -> None:
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="console-assets")
    app.add_api_route("/ui/", console_page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui", console_redirect, methods=["GET"], include_in_schema=False)
    app.router.routes.extend(router.routes)
