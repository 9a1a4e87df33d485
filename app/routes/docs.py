"""Single documents: ``PUT``/``GET``/``DELETE /docs/{key}``.

Values are opaque bytes (any content type).  ``If-Match: "<cas>"`` makes a write a
compare-and-swap; losing it is 412 Precondition Failed.  ``?durability=persist`` holds
the answer until the write is fsynced.
"""
from __future__ import annotations

import asyncio
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Query, Request
from starlette.convertors import Convertor, register_url_convertor
from starlette.responses import Response

from app.deps import ReadUser, RunnerDep, SettingsDep, WriteUser
from app.limits import read_body
from app.models import WriteResult as WriteResultModel
from app.problems import INVALID_INPUT, Problem
from app.results import version_headers, write_result_dict
from app.routes.responses import problems
from engine.types import Durability, Op, WriteOp

router = APIRouter(prefix="/docs", tags=["documents"])


class _KeyConvertor(Convertor[str]):
    """Any text, newlines included (Starlette's ``path`` convertor stops at a newline, which
    would turn a valid key into a 404 for the route); the engine validates the key."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("doc_key", _KeyConvertor())

DurabilityQuery = Annotated[
    Durability, Query(description="memory: answer once queued; persist: answer once fsynced")
]
# Typed ``str`` (default None) rather than ``str | None`` so the schema does not offer null.
IfMatch = Annotated[
    str,
    Header(
        description='CAS the document must currently have, as returned in ETag ("123" or 123)',
        pattern=r'^\s*("[1-9][0-9]{0,19}"|[1-9][0-9]{0,19})\s*$',
    ),
]

_VALUE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": False,
        "description": "the value, stored as these exact bytes (any content type; none = empty value)",
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "*/*": {"schema": {}},
        },
    }
}

_VERSION_HEADERS = {
    "ETag": {"description": "quoted CAS", "schema": {"type": "string"}},
    "X-Upr-Cas": {"schema": {"type": "string"}},
    "X-Upr-Seqno": {"schema": {"type": "string"}},
    "X-Upr-Partition": {"schema": {"type": "string"}},
    "X-Upr-Rev": {"schema": {"type": "string"}},
}


def parse_if_match(value: str | None) -> int | None:
    """The CAS in an ``If-Match`` header (quoted or bare decimal), or None when absent."""
    if value is None:
        return None
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    if not text.isascii() or not text.isdigit() or len(text) > 20 or int(text) >= 1 << 64:
        raise Problem(INVALID_INPUT, 'If-Match must be a CAS as returned in ETag, e.g. "1234"', field="header.if-match")
    return int(text)


def _write(engine: Any, op: WriteOp, persist: bool) -> tuple[Any, Any]:
    """Writer thread: queue the write, and ask for its persist future in the same hop."""
    res = engine.write(op)
    return res, (engine.persist_future({res.partition: res.seqno}) if persist else None)


async def _apply(runner: RunnerDep, op: WriteOp, durability: Durability) -> Response:
    persist = durability is Durability.PERSIST
    res, future = await runner.write(_write, runner.engine, op, persist)
    if future is not None:
        await asyncio.wrap_future(future)
    body = orjson.dumps(write_result_dict(res, durability.value))
    return Response(body, 200, version_headers(res), media_type="application/json")


@router.put(
    "/{key:doc_key}",
    summary="Create or replace a document",
    response_model=WriteResultModel,
    openapi_extra=_VALUE_BODY,
    responses={200: {"headers": _VERSION_HEADERS}, **problems(401, 403, 412, 413, 422, 429, 503)},
)
async def put_doc(
    key: str,
    request: Request,
    runner: RunnerDep,
    settings: SettingsDep,
    _user: WriteUser,
    durability: DurabilityQuery = Durability.MEMORY,
    if_match: IfMatch = None,  # type: ignore[assignment]
) -> Response:
    """The body is the value.  With `If-Match` the write happens only if the document's
    CAS still matches (412 otherwise).  The answer carries partition, seqno and CAS."""
    cas = parse_if_match(if_match)
    value = await read_body(request, settings.max_value_bytes, "the value")
    return await _apply(runner, WriteOp(Op.MUTATION, key, value, cas), durability)


@router.delete(
    "/{key:doc_key}",
    summary="Delete a document",
    response_model=WriteResultModel,
    responses={200: {"headers": _VERSION_HEADERS}, **problems(401, 403, 404, 412, 422, 429, 503)},
)
async def delete_doc(
    key: str,
    runner: RunnerDep,
    _user: WriteUser,
    durability: DurabilityQuery = Durability.MEMORY,
    if_match: IfMatch = None,  # type: ignore[assignment]
) -> Response:
    """Leaves a tombstone that streams deliver as a deletion.  404 if there is no live document."""
    cas = parse_if_match(if_match)
    return await _apply(runner, WriteOp(Op.DELETION, key, b"", cas), durability)


@router.get(
    "/{key:doc_key}",
    summary="Read a document",
    response_class=Response,
    responses={
        200: {
            "description": "the value bytes, as written",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            "headers": _VERSION_HEADERS,
        },
        **problems(401, 403, 404, 422, 503),
    },
)
async def get_doc(key: str, runner: RunnerDep, _user: ReadUser) -> Response:
    """The current value; CAS (also as ETag), seqno, partition and revision in headers."""
    doc = await runner.read(runner.engine.get, key)
    return Response(doc.value, 200, version_headers(doc), media_type="application/octet-stream")
