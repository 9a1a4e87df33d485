"""The interactive API docs (Swagger UI at ``/api/docs``), served from assets inside the package.

WHY not FastAPI's default page: it loads Swagger UI from a public CDN, so on a machine without
internet access (a data centre, a laptop on a plane) ``/api/docs`` was a blank page.  The assets
are vendored under ``app/static/swagger-ui`` (see its README for the version and how to update)
and served by this app; the page names no other host (Swagger UI's online validator is off too).
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS_URL = "/api/docs"
OAUTH2_REDIRECT_URL = "/api/docs/oauth2-redirect"
ASSETS_URL = "/api/static/swagger-ui"
ASSETS_DIR = Path(__file__).resolve().parent / "static" / "swagger-ui"


def install(app: FastAPI) -> None:
    """Add the docs page, its OAuth2 redirect page and the assets they load."""
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="swagger-ui-assets")

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or "/openapi.json"),
            title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon-32x32.png",
            oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
            swagger_ui_parameters={"validatorUrl": None},
        )

    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    app.add_api_route(DOCS_URL, swagger_ui, methods=["GET"], include_in_schema=False)
    app.add_api_route(OAUTH2_REDIRECT_URL, oauth2_redirect, methods=["GET"], include_in_schema=False)
