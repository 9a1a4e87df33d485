"""Dependencies shared by the routers, as ``Annotated`` aliases (one place to override in tests).

The app keeps its long-lived objects on ``app.state`` (set up by the factory and the
lifespan); these functions hand them to routes and enforce roles.  They are ``async def``
on purpose: FastAPI runs plain ``def`` dependencies in a thread pool, which costs more
than everything they do.
"""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBearer
from starlette.requests import HTTPConnection

from app.auth import Principal, Role, TokenTable, authorize_connection
from app.metrics import Metrics
from app.problems import ENGINE_CLOSED, Problem
from app.runner import EngineRunner
from app.settings import Settings
from app.streams_registry import StreamRegistry


async def get_settings(conn: HTTPConnection) -> Settings:
    return conn.app.state.settings  # type: ignore[no-any-return]


async def get_tokens(conn: HTTPConnection) -> TokenTable:
    return conn.app.state.tokens  # type: ignore[no-any-return]


async def get_metrics(conn: HTTPConnection) -> Metrics:
    return conn.app.state.metrics  # type: ignore[no-any-return]


async def get_streams(conn: HTTPConnection) -> StreamRegistry:
    return conn.app.state.streams  # type: ignore[no-any-return]


async def get_runner(conn: HTTPConnection) -> EngineRunner:
    runner: EngineRunner | None = getattr(conn.app.state, "runner", None)
    if runner is None:
        raise Problem(ENGINE_CLOSED, "the engine is not open (starting or shutting down)", headers={"Retry-After": "1"})
    return runner


#: Declares bearer auth in the OpenAPI document; the check itself is ``app.auth.authorize``.
bearer_scheme = HTTPBearer(auto_error=False, description="token from --tokens-file or UPR_TOKENS")


def _require(role: Role):  # type: ignore[no-untyped-def]
    async def check(request: Request, _: Annotated[object, Depends(bearer_scheme)] = None) -> Principal:
        return authorize_connection(request.app.state.tokens, request, role)

    check.__name__ = f"require_{role.name.lower()}"
    return check


require_read = _require(Role.READ)
require_write = _require(Role.WRITE)
require_admin = _require(Role.ADMIN)

SettingsDep = Annotated[Settings, Depends(get_settings)]
TokensDep = Annotated[TokenTable, Depends(get_tokens)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
StreamsDep = Annotated[StreamRegistry, Depends(get_streams)]
RunnerDep = Annotated[EngineRunner, Depends(get_runner)]
ReadUser = Annotated[Principal, Depends(require_read)]
WriteUser = Annotated[Principal, Depends(require_write)]
AdminUser = Annotated[Principal, Depends(require_admin)]
