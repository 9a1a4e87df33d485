"""``POST /docs/_bulk``: many sets/deletes in one request, one durability wait."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from weakref import WeakKeyDictionary

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from app import bulk
from app.deps import Ctx, WriteCtx
from app.limits import read_body
from app.cluster.durable import DurabilityImpossible, majority_wait, problem_of
from app.params import (
    DURABILITY_PARAM,
    DURABILITY_TIMEOUT_PARAM,
    RESULTS_PARAM,
    bulk_query_of,
)
from app.routes.docs import durable_writes
from app.models import BulkColumnsResult, BulkItem, BulkResult
from app.routes.responses import problems
from engine.core.types import Durability

router = APIRouter(prefix="/docs", tags=["documents"])
#: the route's path, as ``app.fast_bulk`` matches it
PATH = "/docs/_bulk"

_ITEM_REF = {"$ref": "#/components/schemas/BulkItem"}
_BULK_BODY: dict[str, Any] = {
    "parameters": [{**DURABILITY_PARAM, "description": "one wait for the whole batch: " + DURABILITY_PARAM["description"]
                    + ".  A 504 durability-ambiguous answer covers the whole batch: every successful item may "
                    "have been applied"},
                   DURABILITY_TIMEOUT_PARAM, RESULTS_PARAM],
    "requestBody": {
        "required": True,
        "description": "a JSON array of operations, or NDJSON with one operation per line",
        "content": {
            "application/json": {"schema": {"type": "array", "items": _ITEM_REF}},
            "application/x-ndjson": {"schema": {"type": "string", "pattern": "\\S"}},
        },
    }
}


def _run(engine: Any, body: bytes, ndjson: bool, max_items: int, durability: Durability,
         columns: bool = False, impossible: Mapping[int, DurabilityImpossible] | None = None,
         ) -> tuple[tuple[bytes, int, int, dict[int, int]], Any]:
    """Writer thread: parse, write the batch, and take its persist future in one hop; returns
    (the encoded answer, its counts and the highest seqno written per partition; the persist
    future or None).  A batch with an item in one of the ``impossible`` partitions is refused
    whole before anything is written (``bulk.refuse_impossible``)."""
    with bulk.gc_paused():
        items = bulk.decode(body, ndjson, max_items)
        if impossible:
            bulk.refuse_impossible(items, engine.partition_of, impossible)
        out, targets = bulk.apply(engine, items, durability.value, columns)
        encoded = orjson.dumps(out)
    future = engine.persist_future(targets) if durability.persist and targets else None
    return (encoded, out["succeeded"], out["failed"], targets), future


@router.post(
    "/_bulk",
    summary="Write many documents",
    response_model=BulkResult | BulkColumnsResult,
    openapi_extra=_BULK_BODY,
    responses=problems(401, 403, 413, 422, 429, 503, 507),
)
async def post_bulk(
    request: Request,
    ctx: WriteCtx,
) -> Response:
    """Items are `{"op": "set"|"delete", "key": K, "value": <JSON> | "value_b64": <base64>, "cas": N?}`.
    Each gets its own result (`status` 200, or the status and problem of its error); a bad
    item does not stop the others.  `results=columns` answers with one array per field
    instead of one object per item (much cheaper for large batches).  With `durability=persist` the answer waits until every
    successful item is fsynced (with `majority`/`persist_majority`, until a majority of each written partition's
    copies hold them; 504 `durability-ambiguous` past `durability_timeout_ms`; 503 `durability-impossible`, with nothing
    applied, when an item's partition has too few live copies to form a majority); on a full disk it is 507 (the items were applied and stay queued in
    memory until space returns; `unpersisted` names each partition and seqno)."""
    return await answer(request, ctx)


async def answer(request: Request, ctx: Ctx) -> Response:
    """The route's work for an authorised caller: shared by the route and ``app.fast_bulk``."""
    settings, runner, metrics = ctx.settings, ctx.runner, ctx.metrics
    durability, timeout_s, columns = bulk_query_of(request, settings.durability_timeout_ms)
    body = await read_body(request, settings.max_bulk_bytes, "the bulk body")
    ndjson = bulk.is_ndjson(request.headers.get("content-type"), body)
    majority = durability.majority
    durable = durable_writes(ctx) if majority else None
    # partitions whose live copies cannot form a majority: the batch is refused before it is
    # written if it touches one (503), as a single document is, rather than applied and then
    # answered "ambiguous"
    impossible = durable.impossible() if durable is not None else None
    try:
        out, ok, failed, targets = await runner.write_durable(_run, runner.engine, body, ndjson,
                                                              settings.max_bulk_items, durability, columns, impossible)
    except DurabilityImpossible as exc:
        assert durable is not None
        durable.count_failure("impossible", durability.value)
        raise problem_of(exc) from None
    if majority:
        await majority_wait(durable, targets, durability.persist, timeout_s)
    counted_ok, counted_failed = _outcomes_of(metrics.bulk_items)
    counted_ok.inc(ok)
    if failed:
        counted_failed.inc(failed)
    return Response(out, 200, media_type="application/json")


#: ``upr_bulk_items``' two children per counter (one counter per app): ``labels()`` takes a
#: lock and builds its key on every call, a visible share of a small bulk's loop time
#: (docs/benchmarks.md, Peers, "uvicorn's proxy-headers layer off")
_OUTCOMES: WeakKeyDictionary[Any, tuple[Any, Any]] = WeakKeyDictionary()


def _outcomes_of(counter: Any) -> tuple[Any, Any]:
    children = _OUTCOMES.get(counter)
    if children is None:
        children = _OUTCOMES[counter] = (counter.labels("ok"), counter.labels("failed"))
    return children


__all__ = ["router", "answer", "BulkItem", "PATH"]
