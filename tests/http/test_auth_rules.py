"""``app.auth``'s rules without a server: roles, protected mode, binding, token files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.auth import AuthError, Role, TokenConfigError, TokenTable, authorize, check_bind, is_loopback


TABLE = TokenTable([("reader-token-1", Role.READ, "r"), ("writer-token-1", Role.WRITE, "w"),
                    ("admin-token-01", Role.ADMIN, "a")])


@pytest.mark.parametrize(
    ("token", "role", "outcome"),
    [
        ("reader-token-1", Role.READ, "r"),
        ("reader-token-1", Role.WRITE, 403),
        ("writer-token-1", Role.WRITE, "w"),
        ("writer-token-1", Role.ADMIN, 403),
        ("admin-token-01", Role.ADMIN, "a"),
        ("admin-token-01", Role.READ, "a"),
        ("admin-token-0", Role.READ, 401),
        ("", Role.READ, 401),
        (None, Role.READ, 401),
    ],
)
def test_authorize(token: str | None, role: Role, outcome: str | int) -> None:
    if isinstance(outcome, int):
        with pytest.raises(AuthError) as info:
            authorize(TABLE, token, role)
        assert info.value.status == outcome
    else:
        assert authorize(TABLE, token, role).name == outcome


def test_protected_mode_admits_loopback_only() -> None:
    empty = TokenTable()
    assert authorize(empty, None, Role.ADMIN, client_host="127.0.0.1").role is Role.ADMIN
    assert authorize(empty, None, Role.ADMIN, client_host="::1").role is Role.ADMIN
    with pytest.raises(AuthError):
        authorize(empty, None, Role.READ, client_host="10.1.2.3")


@pytest.mark.parametrize(
    ("host", "has_tokens", "refused"),
    [("127.0.0.1", False, False), ("localhost", False, False), ("::1", False, False), ("127.3.4.5", False, False),
     ("0.0.0.0", False, True), ("::", False, True), ("192.168.1.5", False, True), ("example.com", False, True),
     ("0.0.0.0", True, False)],
)
def test_check_bind(host: str, has_tokens: bool, refused: bool) -> None:
    tokens = TABLE if has_tokens else TokenTable()
    reason = check_bind(host, tokens)
    assert (reason is not None) is refused
    if reason:
        assert "\n" not in reason and host in reason
    assert is_loopback(host) is (not refused or has_tokens) or has_tokens


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("t.toml", '[tokens]\n"tok-read-0001" = "read"\n"tok-admin-001" = "admin"\n'),
        ("t.toml", '[[tokens]]\ntoken = "tok-read-0001"\nrole = "read"\n[[tokens]]\ntoken = "tok-admin-001"\nrole = "ADMIN"\n'),
        ("t.json", json.dumps({"tokens": {"tok-read-0001": "read", "tok-admin-001": "admin"}})),
        ("t.json", json.dumps([{"token": "tok-read-0001", "role": "read"}, {"token": "tok-admin-001", "role": "admin"}])),
    ],
)
def test_token_files(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    table = TokenTable.load(path)
    assert len(table) == 2
    assert table.lookup("tok-read-0001").role is Role.READ  # type: ignore[union-attr]
    assert table.lookup("tok-admin-001").role is Role.ADMIN  # type: ignore[union-attr]
    assert table.lookup("tok-admin-00") is None


@pytest.mark.parametrize(
    ("inline", "count"),
    [("tok-read-0001=read,tok-write-001=write", 2), ('{"tok-a-000001": "admin"}', 1), ("", 0)],
)
def test_inline_tokens(inline: str, count: int) -> None:
    assert len(TokenTable.load(None, inline)) == count


@pytest.mark.parametrize(
    "inline", ["short=read", "tok-read-0001=owner", "tok-read-0001", "{not json", "tok-read-0001=read,tok-read-0001=admin"]
)
def test_bad_tokens(inline: str) -> None:
    with pytest.raises(TokenConfigError):
        TokenTable.load(None, inline)
