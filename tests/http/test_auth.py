"""Bearer tokens per role, and protected mode, against real server processes."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.support.server import ROOT, ServerProcess, start_server
from tests.support.auth import TOKENS
from tests.support.problems import problem

pytestmark = pytest.mark.slow

READ, WRITE, ADMIN = (t for t in TOKENS)


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("upr-auth"), tokens=TOKENS)
    yield srv
    srv.kill()


def call(srv: ServerProcess, token: str | None, method: str, path: str, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if kw.get("content") is not None:
        headers["Content-Type"] = "application/json"
    return httpx.request(method, srv.url + path, headers=headers, timeout=10, **kw)  # type: ignore[arg-type]


# (method, path, body, least role needed)
ENDPOINTS = [
    ("GET", "/docs/seeded", None, "read"),
    ("GET", "/status", None, "read"),
    ("GET", "/partitions", None, "read"),
    ("GET", "/partitions/0", None, "read"),
    ("GET", "/streams", None, "read"),
    ("GET", "/metrics", None, "read"),
    ("PUT", "/docs/w", b"v", "write"),
    ("DELETE", "/docs/seeded-del", None, "write"),
    ("POST", "/docs/_bulk", b'[{"op":"set","key":"b","value":1}]', "write"),
    ("POST", "/admin/flush", None, "admin"),
    ("POST", "/admin/partitions/1/state", b'{"state":"active"}', "admin"),
    ("POST", "/admin/compact", b'{"older_than_s": 3600}', "admin"),
]
RANK = {"read": 1, "write": 2, "admin": 3}


@pytest.mark.parametrize(("method", "path", "body", "needed"), ENDPOINTS)
def test_roles(authed: ServerProcess, method: str, path: str, body: bytes | None, needed: str) -> None:
    def seed() -> None:
        for key in ("seeded", "seeded-del"):
            assert call(authed, WRITE, "PUT", f"/docs/{key}", content=b"s").status_code == 200

    seed()
    r = call(authed, None, method, path, content=body)
    problem(r, 401, "unauthorized")
    assert r.headers["www-authenticate"].startswith("Bearer")
    problem(call(authed, "not-a-token-at-all", method, path, content=body), 401, "unauthorized")
    for token, role in TOKENS.items():
        seed()
        r = call(authed, token, method, path, content=body)
        if RANK[role] >= RANK[needed]:
            assert r.status_code == 200, (role, r.text)
        else:
            body_ = problem(r, 403, "forbidden")
            assert body_["required_role"] == needed


def test_health_and_ready_need_no_token(authed: ServerProcess) -> None:
    assert call(authed, None, "GET", "/health").status_code == 200
    assert call(authed, None, "GET", "/ready").json() == {"ready": True, "engine_open": True, "flusher_running": True}


def test_status_reports_auth_mode(authed: ServerProcess) -> None:
    assert call(authed, READ, "GET", "/status").json()["protected_mode"] is False


def test_tokens_from_environment(upr_server) -> None:  # type: ignore[no-untyped-def]
    srv = upr_server(env={"UPR_TOKENS": "env-reader-001=read,env-writer-001=write"})
    assert call(srv, "env-reader-001", "GET", "/status").status_code == 200
    problem(call(srv, "env-reader-001", "PUT", "/docs/x", content=b"1"), 403, "forbidden")
    assert call(srv, "env-writer-001", "PUT", "/docs/x", content=b"1").status_code == 200
    problem(call(srv, None, "GET", "/status"), 401, "unauthorized")


def test_protected_mode_serves_loopback_and_says_so(upr_server) -> None:  # type: ignore[no-untyped-def]
    srv = upr_server(args=["--log-level", "info"])
    assert call(srv, None, "POST", "/admin/flush").status_code == 200
    assert call(srv, None, "GET", "/status").json()["protected_mode"] is True
    assert "protected mode" in srv.log()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_refuses_non_loopback_without_tokens(tmp_path, host: str) -> None:  # type: ignore[no-untyped-def]
    env = {"PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "server", "--host", host, "--port", "0", "--data-dir", str(tmp_path / "d")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "protected mode" in lines[0] and host in lines[0]
    assert not (tmp_path / "d").exists()  # refused before opening anything


@pytest.mark.parametrize(
    ("args", "words"),
    [(["--partitions", "0"], "partitions"), (["--tokens-file", "/nonexistent/t.toml"], "cannot read tokens file"),
     (["--config", "/nonexistent/upr.toml"], "does not exist"), (["--log-level", "loud"], "log_level")],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path, args: list[str], words: str) -> None:  # type: ignore[no-untyped-def]
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "server", "--port", "0", "--data-dir", str(tmp_path / "d"), *args],
        cwd=ROOT, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1
