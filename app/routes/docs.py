"""Single documents: ``PUT``/``GET``/``DELETE /docs/{key}``.

Values are opaque bytes (any content type).  These are the hottest routes, so they read
their parameters by hand (``app.params``), resolve their context with ``ctx_for``, and are
served without FastAPI's request handler (``app.plain``).  ``If-Match: "<cas>"`` makes a write a
compare-and-swap; losing it is 412 Precondition Failed.  ``?durability=persist`` holds
the answer until the write is fsynced; on a full disk it is 507 (applied, queued, not yet persisted).
"""
from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.convertors import Convertor, register_url_convertor
from starlette.responses import Response

from app.deps import Ctx, ctx_for, read_ctx, write_ctx
from app.limits import read_body
from app.models import WriteResult as WriteResultModel
from app.cluster.durable import DurableWrites, check_possible, majority_wait
from app.params import (
    DURABILITY_PARAM,
    DURABILITY_TIMEOUT_PARAM,
    IF_MATCH_PARAM,
    KEY_PARAM,
    durability_of,
    durability_timeout_of,
    if_match_of,
    key_of,
)
from app.plain import serve_plainly
from app.problems import PAUSED_WRITE_WAIT_S
from app.results import version_headers, write_result_dict
from app.routes.responses import problems
from engine.core.errors import KeyNotFound, PartitionNotActive
from engine.core.types import Durability, Op, PartitionState, WriteOp
from engine.engine import Engine

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

_WRITE_PARAMS: dict[str, Any] = {"parameters": [KEY_PARAM, DURABILITY_PARAM, DURABILITY_TIMEOUT_PARAM, IF_MATCH_PARAM]}
_VALUE_BODY: dict[str, Any] = {
    **_WRITE_PARAMS,
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


def durable_writes(ctx: Ctx) -> DurableWrites | None:
    """The cluster's durable-write tracker; None on a single node, where a majority is the node."""
    cluster = getattr(ctx.state, "cluster", None)
    return cluster.durable if cluster is not None else None


async def _apply(request: Request, ctx: Ctx, op: WriteOp, durability: Durability) -> Response:
    timeout_s = durability_timeout_of(request, ctx.settings.durability_timeout_ms)  # checked at every level
    cluster = getattr(ctx.state, "cluster", None)
    if cluster is not None and cluster.handover.records:
        # a handover's target between the fence and its takeover: the write waits for the
        # takeover here instead of being refused (its source sent it here with a 421)
        partition = ctx.runner.engine.partition_of(op.key)
        if cluster.handover.taking_over(partition):
            await cluster.handover.until_active(partition, PAUSED_WRITE_WAIT_S)
        elif cluster.handover.in_handover(partition) and ctx.runner.engine.writes_stopped(partition):
            # this node, the source, has stopped the partition's writes: refused here, not after a
            # turn of the writer thread behind the writes in flight, so the write waits for the
            # switch (the error handler's ``until_settled``) from now on and leaves with its 421
            # the moment the switch is sent; the engine would refuse it the same way
            raise PartitionNotActive(f"partition {partition} is being handed over (writes stopped)",
                                     partition=partition)
    if durability.majority:
        return await _apply_majority(ctx, op, durability, timeout_s)
    res = await ctx.runner.write_one(op, durability is Durability.PERSIST)
    body = orjson.dumps(write_result_dict(res, durability.value))
    return Response(body, 200, version_headers(res), media_type="application/json")


async def _apply_majority(ctx: Ctx, op: WriteOp, durability: Durability, timeout_s: float) -> Response:
    """Refused before writing when the partition cannot form a majority; else written (and
    fsynced on the active for persist_majority), then held until a majority holds it."""
    runner = ctx.runner
    durable = durable_writes(ctx)
    if durable is not None:
        check_possible(durable, runner.engine.partition_of(op.key), durability.value)
    res = await runner.write_one(op, durability.persist)
    await majority_wait(durable, {res.partition: res.seqno}, durability.persist, timeout_s)
    body = orjson.dumps(write_result_dict(res, durability.value))
    return Response(body, 200, version_headers(res), media_type="application/json")


@router.put(
    "/{key:doc_key}",
    summary="Create or replace a document",
    response_model=WriteResultModel,
    openapi_extra=_VALUE_BODY,
    responses={200: {"headers": _VERSION_HEADERS}, **problems(401, 403, 412, 413, 422, 429, 503, 504, 507)},
)
async def put_doc(request: Request) -> Response:
    """The body is the value.  With `If-Match` the write happens only if the document's
    CAS still matches (412 otherwise).  The answer carries partition, seqno and CAS.  With
    `durability=persist` on a full disk the answer is 507: the write is applied and queued in
    memory, and is persisted once space returns."""
    ctx = await ctx_for(request, write_ctx)
    key, durability, cas = key_of(request), durability_of(request), if_match_of(request)
    value = await read_body(request, ctx.settings.max_value_bytes, "the value")
    return await _apply(request, ctx, WriteOp(Op.MUTATION, key, value, cas), durability)


@router.delete(
    "/{key:doc_key}",
    summary="Delete a document",
    response_model=WriteResultModel,
    openapi_extra=_WRITE_PARAMS,
    responses={200: {"headers": _VERSION_HEADERS}, **problems(401, 403, 404, 412, 422, 429, 503, 504, 507)},
)
async def delete_doc(request: Request) -> Response:
    """Leaves a tombstone that streams deliver as a deletion.  404 if there is no live document."""
    ctx = await ctx_for(request, write_ctx)
    key, durability, cas = key_of(request), durability_of(request), if_match_of(request)
    return await _apply(request, ctx, WriteOp(Op.DELETION, key, b"", cas), durability)


@router.get(
    "/{key:doc_key}",
    summary="Read a document",
    response_class=Response,
    openapi_extra={"parameters": [KEY_PARAM]},
    responses={
        200: {
            "description": "the value bytes, as written",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            "headers": _VERSION_HEADERS,
        },
        **problems(401, 403, 404, 422, 503),
    },
)
async def get_doc(request: Request) -> Response:
    """The current value; CAS (also as ETag), seqno, partition and revision in headers."""
    ctx = await ctx_for(request, read_ctx)
    runner = ctx.runner
    clustered = getattr(request.app.state, "cluster", None) is not None
    try:
        doc = await runner.read(runner.engine.get, key_of(request))
    except KeyNotFound as exc:
        if clustered and exc.partition is not None:
            _served_here(runner.engine, exc.partition)
        raise
    if clustered:
        _served_here(runner.engine, doc.partition)
    return Response(doc.value, 200, version_headers(doc), media_type="application/octet-stream")


def _served_here(engine: Engine, partition: int) -> None:
    """In a cluster a document is read where its partition is active (a 421 names that node), as
    Couchbase answers NOT_MY_VBUCKET: a replica's copy may lag, and a node that holds no copy
    would answer 404 for a document that exists."""
    state = engine.state(partition)
    if state is not PartitionState.ACTIVE:
        raise PartitionNotActive(f"partition {partition} is {state.value} on this node", partition=partition)


serve_plainly(router.routes)
