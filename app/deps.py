"""Dependencies shared by the routers, as ``Annotated`` aliases (one place to override in tests).

The app keeps its long-lived objects on ``app.state`` (set up by the factory and the
lifespan); these functions hand them to routes and enforce roles.

WHY so few and so flat: FastAPI's dependency solving is the largest cost of a small
request here (measured: ~40% of a single-document PUT with five nested dependencies).
So a route takes one context dependency (``ReadCtx``/``WriteCtx``/``AdminCtx``: the
caller checked for the role, plus the app's objects), every dependency is ``async def``
(a plain ``def`` runs in a thread pool), and the bearer scheme is declared in the
OpenAPI document by ``app.main`` rather than by a per-request ``HTTPBearer`` dependency.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from starlette.datastructures import State
from starlette.requests import HTTPConnection

from app.auth import Principal, Role, TokenTable, authorize_connection
from app.metrics import Metrics
from app.problems import ENGINE_CLOSED, Problem
from app.runner import EngineRunner
from app.settings import Settings
from app.streams_registry import StreamRegistry


def _runner_of(state: State) -> EngineRunner:
    runner: EngineRunner | None = getattr(state, "runner", None)
    if runner is None:
        raise Problem(ENGINE_CLOSED, "the engine is not open (starting or shutting down)", headers={"Retry-After": "1"})
    return runner


@dataclass(slots=True)
class Ctx:
    """An authorised caller and the app's long-lived objects."""

    principal: Principal
    state: State

    @property
    def runner(self) -> EngineRunner:
        """The engine behind its executors; 503 problem while the engine is not open."""
        return _runner_of(self.state)

    @property
    def settings(self) -> Settings:
        return self.state.settings  # type: ignore[no-any-return]

    @property
    def metrics(self) -> Metrics:
        return self.state.metrics  # type: ignore[no-any-return]

    @property
    def streams(self) -> StreamRegistry:
        return self.state.streams  # type: ignore[no-any-return]

    @property
    def tokens(self) -> TokenTable:
        return self.state.tokens  # type: ignore[no-any-return]


async def read_ctx(request: Request) -> Ctx:
    state = request.app.state
    return Ctx(authorize_connection(state.tokens, request, Role.READ), state)


async def write_ctx(request: Request) -> Ctx:
    state = request.app.state
    return Ctx(authorize_connection(state.tokens, request, Role.WRITE), state)


async def admin_ctx(request: Request) -> Ctx:
    state = request.app.state
    return Ctx(authorize_connection(state.tokens, request, Role.ADMIN), state)


async def ctx_for(request: Request, dependency: Callable[[Request], Awaitable[Ctx]]) -> Ctx:
    """``dependency`` called directly, honouring ``app.dependency_overrides``.

    For the single-document routes only: there, declaring the context as a dependency
    costs ~13% of the request (measured), so they call this instead; tests override
    ``read_ctx``/``write_ctx`` the usual way and it still applies."""
    return await request.app.dependency_overrides.get(dependency, dependency)(request)  # type: ignore[no-any-return]


async def get_settings(conn: HTTPConnection) -> Settings:
    return conn.app.state.settings  # type: ignore[no-any-return]


async def get_runner(conn: HTTPConnection) -> EngineRunner:
    return _runner_of(conn.app.state)


async def require_read(request: Request) -> Principal:
    return authorize_connection(request.app.state.tokens, request, Role.READ)


async def require_write(request: Request) -> Principal:
    return authorize_connection(request.app.state.tokens, request, Role.WRITE)


async def require_admin(request: Request) -> Principal:
    return authorize_connection(request.app.state.tokens, request, Role.ADMIN)


ReadCtx = Annotated[Ctx, Depends(read_ctx)]
WriteCtx = Annotated[Ctx, Depends(write_ctx)]
AdminCtx = Annotated[Ctx, Depends(admin_ctx)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
RunnerDep = Annotated[EngineRunner, Depends(get_runner)]
ReadUser = Annotated[Principal, Depends(require_read)]
WriteUser = Annotated[Principal, Depends(require_write)]
AdminUser = Annotated[Principal, Depends(require_admin)]
