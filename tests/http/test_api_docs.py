"""``/api/docs`` works offline: the page loads Swagger UI from this server, never from another host."""
from __future__ import annotations

import re

import httpx

ASSET_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


async def test_docs_page_names_no_external_host(inproc: httpx.AsyncClient) -> None:
    r = await inproc.get("/api/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "SwaggerUIBundle" in page
    assert not re.search(r"(https?:)?//[a-z0-9]", page, re.I), re.findall(r"(?:https?:)?//[^\s'\"]+", page)
    assert "validatorUrl" in page  # Swagger UI's online validator (validator.swagger.io) is off


async def test_docs_page_assets_are_served(inproc: httpx.AsyncClient) -> None:
    page = (await inproc.get("/api/docs")).text
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)
    assert {u.rsplit(".", 1)[-1] for u in urls} >= {"js", "css", "png"}, urls
    for url in urls:
        assert url.startswith("/"), url
        r = await inproc.get(url)
        assert r.status_code == 200, url
        assert ASSET_TYPES["." + url.rsplit(".", 1)[-1]] in r.headers["content-type"], (url, r.headers)
        assert len(r.content) > 500, url
    assert (await inproc.get("/openapi.json")).json()["paths"]
    assert (await inproc.get("/api/docs/oauth2-redirect")).status_code == 200
