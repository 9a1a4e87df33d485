"""Bearer tokens with three ordered roles, and the protected-mode rule.

    read  < write < admin       each role may do everything the lower ones may

Tokens come from a TOML or JSON file (``--tokens-file``) and/or ``UPR_TOKENS``.  Both
accept either a mapping ``{token: role}`` or a list of ``{token, role, name}`` tables,
under a ``tokens`` key::

    [tokens]                       [[tokens]]
    "s3cr3t-admin" = "admin"       token = "s3cr3t-ingest"
                                   role = "write"
                                   name = "ingest-job"

``UPR_TOKENS`` may also be ``token=role,token=role``.

Protected mode (as in Redis): with no tokens at all the server binds only loopback
addresses and treats every local caller as admin; asked to bind anything else it
refuses to start.  ``authorize`` is plain and synchronous so the WebSocket endpoint
can call it before accepting the upgrade.
"""
from __future__ import annotations

import enum
import functools
import hmac
import ipaddress
import json
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import HTTPConnection


class Role(enum.IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3


class TokenConfigError(ValueError):
    """The tokens file or variable cannot be used; the message says why."""


class AuthError(Exception):
    """A caller lacks a valid token (401) or a sufficient role (403)."""

    def __init__(self, status: int, detail: str, required: Role) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.required = required


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: Role


LOCAL_ADMIN = Principal("local (protected mode)", Role.ADMIN)


@dataclass(frozen=True, slots=True)
class _Entry:
    token: bytes
    principal: Principal


class TokenTable:
    """The configured tokens.  Lookups compare against every entry in constant time
    so neither a match's position nor a prefix leaks through timing."""

    def __init__(self, entries: Iterable[tuple[str, Role, str]] = ()) -> None:
        self._entries = tuple(_Entry(t.encode(), Principal(n, r)) for t, r, n in entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def protected_mode(self) -> bool:
        return not self._entries

    def lookup(self, token: str) -> Principal | None:
        raw = token.encode("utf-8", "surrogateescape")
        found: Principal | None = None
        for entry in self._entries:
            if hmac.compare_digest(entry.token, raw):
                found = entry.principal
        return found

    @classmethod
    def load(cls, tokens_file: Path | None = None, inline: str | None = None) -> TokenTable:
        entries: list[tuple[str, Role, str]] = []
        if tokens_file is not None:
            entries += _parse_file(Path(tokens_file))
        if inline:
            entries += _parse_inline(inline)
        seen: set[str] = set()
        for token, _, _ in entries:
            if token in seen:
                raise TokenConfigError("the same token is configured twice")
            seen.add(token)
        return cls(entries)


def _parse_file(path: Path) -> list[tuple[str, Role, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokenConfigError(f"cannot read tokens file {path}: {exc.strerror}") from None
    try:
        data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise TokenConfigError(f"tokens file {path} is not valid {path.suffix[1:] or 'TOML'}: {exc}") from None
    return _entries_from(data, str(path))


def _parse_inline(text: str) -> list[tuple[str, Role, str]]:
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            return _entries_from(json.loads(stripped), "UPR_TOKENS")
        except ValueError as exc:
            raise TokenConfigError(f"UPR_TOKENS is not valid JSON: {exc}") from None
    pairs: list[dict[str, str]] = []
    for part in filter(None, (p.strip() for p in stripped.split(","))):
        token, sep, role = part.rpartition("=")
        if not sep or not token:
            raise TokenConfigError("UPR_TOKENS entries must look like token=role")
        pairs.append({"token": token, "role": role})
    return _entries_from(pairs, "UPR_TOKENS")


def _entries_from(data: Any, source: str) -> list[tuple[str, Role, str]]:
    if isinstance(data, Mapping) and "tokens" in data:
        data = data["tokens"]
    out: list[tuple[str, Role, str]] = []
    if isinstance(data, Mapping):
        items: list[Any] = [{"token": t, "role": r} for t, r in data.items()]
    elif isinstance(data, list):
        items = data
    else:
        raise TokenConfigError(f"{source}: expected a mapping token -> role or a list of tables")
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise TokenConfigError(f"{source}: entry {i} is not a table")
        token, role = item.get("token"), item.get("role")
        if not isinstance(token, str) or len(token) < 8:
            raise TokenConfigError(f"{source}: entry {i}: token must be a string of at least 8 characters")
        try:
            parsed = Role[str(role).upper()]
        except KeyError:
            raise TokenConfigError(f"{source}: entry {i}: role must be read, write or admin, not {role!r}") from None
        out.append((token, parsed, str(item.get("name") or f"{source}#{i}")))
    return out


@functools.lru_cache(maxsize=1024)
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, tokens: TokenTable) -> str | None:
    """The one-line reason not to start, or None when binding ``host`` is allowed."""
    if tokens.protected_mode and not is_loopback(host):
        return (
            f"upr: refusing to bind {host} without auth tokens (protected mode); "
            "configure --tokens-file or UPR_TOKENS, or bind 127.0.0.1"
        )
    return None


def bearer_token(conn: HTTPConnection, *, allow_query: bool = False) -> str | None:
    """The token from ``Authorization: Bearer ...`` (or ``?access_token=`` when allowed,
    for WebSocket clients that cannot set headers)."""
    header = conn.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return ""
    if allow_query:
        return conn.query_params.get("access_token")
    return None


def authorize(tokens: TokenTable, token: str | None, role: Role, *, client_host: str | None = None) -> Principal:
    """Who the caller is, if allowed ``role``; raises ``AuthError`` (401/403) otherwise.

    In protected mode every loopback caller is admin; a non-loopback caller (which
    can only reach us through a proxy) is refused, as there is nothing to check."""
    if tokens.protected_mode:
        if client_host is None or is_loopback(client_host):
            return LOCAL_ADMIN
        raise AuthError(403, "protected mode (no tokens configured) serves loopback clients only", role)
    if not token:
        raise AuthError(401, "missing bearer token (Authorization: Bearer <token>)", role)
    principal = tokens.lookup(token)
    if principal is None:
        raise AuthError(401, "unknown bearer token", role)
    if principal.role < role:
        raise AuthError(403, f"role {principal.role.name.lower()} may not do this; {role.name.lower()} required", role)
    return principal


def authorize_connection(
    tokens: TokenTable, conn: HTTPConnection, role: Role, *, allow_query: bool = False
) -> Principal:
    """``authorize`` for a Starlette request or WebSocket (before ``accept()``)."""
    client = conn.client.host if conn.client else None
    return authorize(tokens, bearer_token(conn, allow_query=allow_query), role, client_host=client)
