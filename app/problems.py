"""RFC 9457 problem details: the one place where errors become HTTP responses.

Every error response is ``application/problem+json`` with a stable ``type`` URI
(``https://upr.dev/problems/<slug>``), a ``title`` that is fixed per type, the
``status``, a ``detail`` for this occurrence, and the offending ``field`` /
``partition`` when known.  ``ENGINE_PROBLEMS`` maps the engine's error tree; the
lookup walks the exception's MRO so a new engine subclass inherits its parent's
rendering instead of becoming a 500.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from app.auth import AuthError
from engine.core import errors as E

log = logging.getLogger("upr.http")

PROBLEM_BASE = "https://upr.dev/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"


@dataclass(frozen=True, slots=True)
class ProblemType:
    slug: str
    status: int
    title: str

    @property
    def uri(self) -> str:
        return PROBLEM_BASE + self.slug


INVALID_INPUT = ProblemType("invalid-input", 422, "Invalid input")
INVALID_KEY = ProblemType("invalid-key", 422, "Invalid key")
INVALID_PARTITION = ProblemType("invalid-partition", 422, "Invalid partition")
UNKNOWN_PARTITION = ProblemType("unknown-partition", 404, "Unknown partition")
TOO_LARGE = ProblemType("too-large", 413, "Too large")
KEY_NOT_FOUND = ProblemType("key-not-found", 404, "Key not found")
CAS_MISMATCH = ProblemType("cas-mismatch", 412, "CAS mismatch")
PARTITION_NOT_ACTIVE = ProblemType("partition-not-active", 503, "Partition not active")
#: a document request to a node that is not active for the key's partition (RFC 9110 421): the body
#: names the active node's URL, which a client follows
MISDIRECTED = ProblemType("misdirected-request", 421, "Misdirected request")
#: a replica-only operation (promote, apply replicated items) on a partition in another state
PARTITION_NOT_REPLICA = ProblemType("partition-not-replica", 409, "Partition not a replica")
BACKPRESSURE = ProblemType("backpressure", 429, "Write queue full")
#: WHY 507 (RFC 4918) and not 503: the write was applied; what failed is storing it, for lack of space.
INSUFFICIENT_STORAGE = ProblemType("insufficient-storage", 507, "Insufficient storage: applied but not persisted")
DISK_FULL = ProblemType("disk-full", 507, "Insufficient storage: nothing changed")
SEQNO_RANGE = ProblemType("seqno-range", 416, "Sequence number out of range")
ENGINE_CLOSED = ProblemType("engine-closed", 503, "Engine not available")
ENGINE_ERROR = ProblemType("engine-error", 500, "Engine error")
UNAUTHORIZED = ProblemType("unauthorized", 401, "Unauthorized")
FORBIDDEN = ProblemType("forbidden", 403, "Forbidden")
NOT_FOUND = ProblemType("not-found", 404, "Not found")
METHOD_NOT_ALLOWED = ProblemType("method-not-allowed", 405, "Method not allowed")
UNSUPPORTED_MEDIA_TYPE = ProblemType("unsupported-media-type", 415, "Unsupported media type")
NOT_READY = ProblemType("not-ready", 503, "Not ready")
TOO_MANY_STREAMS = ProblemType("too-many-streams", 503, "Too many stream connections")
TOO_MANY_CLIENT_STREAMS = ProblemType("too-many-client-streams", 429, "Too many stream connections for this client")
INTERNAL = ProblemType("internal-error", 500, "Internal server error")

#: engine error class -> problem type; most specific class first is not required.
ENGINE_PROBLEMS: dict[type[E.UprError], ProblemType] = {
    E.InvalidKey: INVALID_KEY,
    E.InvalidPartition: INVALID_PARTITION,
    E.InvalidInput: INVALID_INPUT,
    E.TooLarge: TOO_LARGE,
    E.KeyNotFound: KEY_NOT_FOUND,
    E.CasMismatch: CAS_MISMATCH,
    E.PartitionNotActive: PARTITION_NOT_ACTIVE,
    E.NotReplica: PARTITION_NOT_REPLICA,
    E.Backpressure: BACKPRESSURE,
    E.InsufficientStorage: INSUFFICIENT_STORAGE,
    E.DiskFull: DISK_FULL,
    E.SeqnoRangeError: SEQNO_RANGE,
    E.EngineClosed: ENGINE_CLOSED,
    E.UprError: ENGINE_ERROR,
}

_BY_STATUS = {p.status: p for p in (NOT_FOUND, METHOD_NOT_ALLOWED, UNSUPPORTED_MEDIA_TYPE, UNAUTHORIZED, FORBIDDEN)}


def problem_type_of(exc: E.UprError) -> ProblemType:
    for cls in type(exc).__mro__:
        found = ENGINE_PROBLEMS.get(cls)  # type: ignore[call-overload]
        if found is not None:
            return found
    return ENGINE_ERROR


class Problem(Exception):
    """Raise from a route to answer with a problem document."""

    def __init__(
        self,
        ptype: ProblemType,
        detail: str,
        *,
        status: int | None = None,
        field: str | None = None,
        partition: int | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.ptype = ptype
        self.status = status or ptype.status
        self.detail = detail
        self.field = field
        self.partition = partition
        self.headers = headers or {}
        self.extra = extra or {}

    @classmethod
    def from_engine(cls, exc: E.UprError, *, status: int | None = None, field: str | None = None) -> Problem:
        ptype = problem_type_of(exc)
        extra: dict[str, Any] = {"code": exc.code}
        headers: dict[str, str] = {}
        if exc.seqno is not None:
            extra["seqno"] = exc.seqno
        if isinstance(exc, E.CasMismatch):
            if exc.expected is not None:
                extra["expected_cas"] = exc.expected
            if exc.actual is not None:
                extra["actual_cas"] = exc.actual
        if isinstance(exc, E.InsufficientStorage):
            # the outcome, machine-readable: the write happened and will be persisted without a retry
            extra["applied"] = True
            extra["persisted"] = False
            extra["unpersisted"] = [{"partition": p, "seqno": s} for p, s in sorted(exc.unpersisted.items())]
        if isinstance(exc, E.DiskFull):
            extra["applied"] = False
        if exc.retriable and ptype.status in (429, 503):
            headers["Retry-After"] = "1"
        return cls(
            ptype, exc.message, status=status, field=field or exc.field,
            partition=exc.partition, headers=headers, extra=extra,
        )

    def body(self, instance: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.ptype.uri, "title": self.ptype.title, "status": self.status, "detail": self.detail,
        }
        if instance:
            out["instance"] = instance
        if self.field is not None:
            out["field"] = self.field
        if self.partition is not None:
            out["partition"] = self.partition
        out.update(self.extra)
        return out

    def response(self, instance: str | None = None) -> Response:
        headers = dict(self.headers)
        if self.status == 413:
            # The rest of an oversized body is never read: the connection cannot be reused.
            headers["Connection"] = "close"
        try:
            content = orjson.dumps(self.body(instance))
        except TypeError:  # e.g. an integer beyond 64 bits echoed from the request
            content = json.dumps(self.body(instance), default=str).encode()
        return Response(content, self.status, headers, media_type=PROBLEM_MEDIA_TYPE)


def item_error(exc: E.UprError | Problem, *, cas_status: int = 409) -> dict[str, Any]:
    """The per-item error of a bulk result (a problem document without ``instance``)."""
    if isinstance(exc, E.UprError):
        status = cas_status if isinstance(exc, E.CasMismatch) else None
        exc = Problem.from_engine(exc, status=status)
    return exc.body()


def _field_of(loc: tuple[Any, ...]) -> str:
    if len(loc) == 2 and loc[0] == "body" and isinstance(loc[1], int):
        return "body"  # JSON decode error at a character offset
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    where = loc[0] if loc else ""
    name = ".".join(parts) or str(where)
    return f"{where}.{name}" if where in ("query", "header") else name


def allowed_methods(request: Request) -> list[str]:
    """The methods served at this path, for a 405's ``Allow`` header.

    WHY not Starlette's: it names only the first partially matching route's methods.  A
    literal path (``/docs/_bulk``) wins over a template that also matches it
    (``/docs/{key}``), as in routing."""
    routes = getattr(request.app.state, "http_routes", ())
    path = request.url.path
    matching = [r for r in routes if r.path_regex.match(path)]
    literal = [r for r in matching if not r.param_convertors]
    methods = {m for r in (literal or matching) for m in (r.methods or ())}
    return sorted(methods)


def misdirected(partition: int, where: dict[str, Any]) -> Problem:
    """421 for a document of ``partition``, naming who serves it per the node's newest map."""
    url = where.get("url")
    detail = (f"partition {partition} is served by node {where['active']} at {url}" if url
              else f"partition {partition} has no active node right now (map revision {where['map_revision']})")
    return Problem(MISDIRECTED, detail, partition=partition, extra=dict(where))


#: how long a write waits during its partition's handover (on the source for the switch, on the
#: target for its takeover) before its answer: past the pause such a handover takes
#: (bench/cluster_rebalance.py), well below a client's timeout
PAUSED_WRITE_WAIT_S = 1.0


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into a problem document."""

    async def on_problem(request: Request, exc: Problem) -> Response:
        return exc.response(request.url.path)

    async def on_engine(request: Request, exc: E.UprError) -> Response:
        cluster = getattr(request.app.state, "cluster", None)
        if cluster is not None and isinstance(exc, E.PartitionNotActive) and exc.partition is not None:
            # a handover of the partition from this node is in flight (writes paused, or the map
            # just switched): the write waits, briefly, until the map names the target, then is
            # sent there with a 421 (nothing was applied here; the target holds it until its
            # takeover has run)
            await cluster.handover.until_settled(exc.partition, PAUSED_WRITE_WAIT_S)
            where = cluster.misdirected(exc.partition)
            # the map names this very node (a pause that outlasted the wait, a handover called
            # off): a retryable 503 rather than a 421 to this node itself
            if where.get("active") != cluster.name:
                return misdirected(exc.partition, where).response(request.url.path)
        return Problem.from_engine(exc).response(request.url.path)

    async def on_auth(request: Request, exc: AuthError) -> Response:
        ptype = UNAUTHORIZED if exc.status == 401 else FORBIDDEN
        headers = {"WWW-Authenticate": 'Bearer realm="upr"'} if exc.status == 401 else None
        problem = Problem(ptype, exc.detail, headers=headers, extra={"required_role": exc.required.name.lower()})
        return problem.response(request.url.path)

    async def on_validation(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {}
        field = _field_of(tuple(first.get("loc", ())))
        detail = f"{field}: {first.get('msg', 'invalid')}" if first else "invalid request"
        issues = [{"field": _field_of(tuple(e.get("loc", ()))), "message": e.get("msg", "")} for e in errors]
        return Problem(INVALID_INPUT, detail, field=field, extra={"errors": issues}).response(request.url.path)

    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == 400:
            # FastAPI's "error parsing the body" (not UTF-8, broken form data): invalid input like the rest.
            return Problem(INVALID_INPUT, str(exc.detail), field="body").response(request.url.path)
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        ptype = _BY_STATUS.get(exc.status_code, ProblemType("http-error", exc.status_code, "HTTP error"))
        return Problem(ptype, str(exc.detail), headers=headers).response(request.url.path)

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return Problem(INTERNAL, "unexpected server error; see the server log").response(request.url.path)

    app.add_exception_handler(Problem, on_problem)  # type: ignore[arg-type]
    app.add_exception_handler(E.UprError, on_engine)  # type: ignore[arg-type]
    app.add_exception_handler(AuthError, on_auth)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, on_crash)
