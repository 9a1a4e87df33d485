"""Forwarded headers: read only from trusted proxies, and never a way past protected mode."""
from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.requests import Request
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app.auth import AuthError, Role, TokenTable, authorize_connection, forwarded_from_afar
from app.server import uvicorn_config
from app.settings import Settings


@pytest.mark.parametrize(
    ("headers", "afar"),
    [
        ([], None),
        ([(b"x-forwarded-for", b"127.0.0.1")], None),
        ([(b"x-forwarded-for", b"127.0.0.1, ::1, [::1]:8080, 127.0.0.1:9")], None),
        ([(b"x-forwarded-for", b"")], None),
        ([(b"x-forwarded-for", b"203.0.113.7")], "203.0.113.7"),
        ([(b"x-forwarded-for", b"127.0.0.1, 203.0.113.7:4711")], "203.0.113.7"),
        ([(b"x-forwarded-for", b"::1"), (b"x-forwarded-for", b"[2001:db8::1]:80")], "2001:db8::1"),
        ([(b"x-forwarded-for", b"unknown")], "unknown"),
        ([(b"forwarded", b'for=127.0.0.1;proto=https, for="[::1]:80"')], None),
        ([(b"forwarded", b"proto=https;For=192.0.2.60;by=127.0.0.1")], "192.0.2.60"),
        ([(b"forwarded", b"for=_hidden")], "_hidden"),
        ([(b"x-real-ip", b"203.0.113.7")], None),
    ],
)
def test_forwarded_from_afar(headers: list[tuple[bytes, bytes]], afar: str | None) -> None:
    assert forwarded_from_afar(headers) == afar


def _request(headers: list[tuple[bytes, bytes]], client: str = "127.0.0.1") -> Request:
    return Request({"type": "http", "method": "GET", "path": "/status", "headers": headers,
                    "client": (client, 5555), "query_string": b""})


def test_protected_mode_refuses_a_caller_a_local_proxy_forwards_from_afar() -> None:
    empty = TokenTable()
    assert authorize_connection(empty, _request([]), Role.ADMIN).role is Role.ADMIN
    assert authorize_connection(empty, _request([(b"x-forwarded-for", b"::1")]), Role.ADMIN).role is Role.ADMIN
    with pytest.raises(AuthError) as info:
        authorize_connection(empty, _request([(b"x-forwarded-for", b"198.51.100.2")]), Role.READ)
    assert info.value.status == 403


def test_with_tokens_the_forwarded_headers_do_not_decide() -> None:
    tokens = TokenTable([("writer-token-1", Role.WRITE, "w")])
    request = _request([(b"authorization", b"Bearer writer-token-1"), (b"x-forwarded-for", b"198.51.100.2")])
    assert authorize_connection(tokens, request, Role.WRITE).name == "w"


def _outer_layer(monkeypatch: pytest.MonkeyPatch, env: str | None, **settings: Any) -> Any:
    if env is None:
        monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    else:
        monkeypatch.setenv("FORWARDED_ALLOW_IPS", env)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    config = uvicorn_config(Settings(**settings), app)
    config.load()
    return config.loaded_app


def test_uvicorn_reads_forwarded_headers_only_from_configured_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not isinstance(_outer_layer(monkeypatch, None), ProxyHeadersMiddleware)
    trusting = _outer_layer(monkeypatch, None, forwarded_allow_ips="10.0.0.0/8, 192.0.2.1")
    assert isinstance(trusting, ProxyHeadersMiddleware)
    assert "10.1.2.3" in trusting.trusted_hosts and "127.0.0.1" not in trusting.trusted_hosts
    from_env = _outer_layer(monkeypatch, "*")  # uvicorn's own variable still works
    assert isinstance(from_env, ProxyHeadersMiddleware) and from_env.trusted_hosts.always_trust


@pytest.mark.slow
@pytest.mark.parametrize(("args", "scheme"), [([], "http"), (["--forwarded-allow-ips", "127.0.0.1"], "https")])
def test_a_server_behind_a_proxy(upr_server: Any, args: list[str], scheme: str) -> None:
    """A trusted proxy's X-Forwarded-Proto shows in the URLs the server builds; in protected
    mode a forwarded remote caller is refused on the bulk path too, trusted proxy or not."""
    srv = upr_server(args=args)
    moved = httpx.get(srv.url + "/status/", headers={"X-Forwarded-Proto": "https"}, timeout=10)
    assert moved.status_code == 307 and moved.headers["location"].startswith(f"{scheme}://")
    bulk = httpx.post(srv.url + "/docs/_bulk", content=b'[{"op":"set","key":"a","value":1}]', timeout=10,
                      headers={"X-Forwarded-For": "203.0.113.7", "Content-Type": "application/json"})
    assert bulk.status_code == 403
    assert httpx.get(srv.url + "/status", headers={"X-Forwarded-For": "127.0.0.1"}, timeout=10).status_code == 200
