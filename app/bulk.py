"""Parsing and applying ``POST /docs/_bulk`` bodies: pure functions, no I/O.

WHY not pydantic models per item: on this machine parsing 1000-item bodies through
pydantic halves bulk throughput compared to orjson plus the few checks below.  Each item
is checked here (shape, op, value vs value_b64, cas); the engine checks keys and sizes.
A bad item gets its own error result and never stops the others.

Accepted bodies: a JSON array of items, or NDJSON (one item per line; a line that is not
valid JSON is an error for that line only).
"""
from __future__ import annotations

import binascii
import contextlib
import gc
from base64 import b64decode
from binascii import a2b_base64
from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, Protocol

import orjson

from app.problems import INVALID_INPUT, TOO_LARGE, Problem, item_error
from engine.errors import UprError
from engine.types import Op, WriteOp, WriteResult

NDJSON_TYPES = ("ndjson", "jsonl", "json-seq", "x-json-stream")
_ALLOWED = frozenset(("op", "key", "value", "value_b64", "cas"))
_MISSING = object()
_MAX_CAS = 1 << 64
_partition_of = itemgetter(1)  # WriteResult.partition
_seqno_of = itemgetter(2)  # WriteResult.seqno


class BatchWriter(Protocol):
    def write_batch(self, ops: Sequence[tuple[Op, str, bytes, int | None]]) -> list[WriteResult | UprError]: ...


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while one request's items are parsed and written.

    WHY: a decoded body with JSON-object values is thousands of young containers, and the
    allocations that follow (one ``WriteOp`` per item, the results) trigger collections that
    traverse them again: measured ≈ 7% of the server's CPU per mutation for 1000-item batches
    of small JSON objects (16.5 → 15.4 µs all in; no change for ``value_b64``).  Nothing here
    creates cycles, so the pause frees nothing late; it lasts one request (milliseconds) and
    collection resumes right after.  Only the writer thread pauses, and only if it was on."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def is_ndjson(content_type: str | None, body: bytes) -> bool:
    """NDJSON if the content type says so; otherwise sniff: an array starts with ``[``."""
    if content_type:
        ct = content_type.lower()
        if any(t in ct for t in NDJSON_TYPES):
            return True
        if "json" in ct:
            return False
    return not body.lstrip()[:1] == b"["


def parse_items(body: bytes, ndjson: bool, max_items: int) -> list[Any]:
    """The decoded items; a line that is not JSON becomes a ``Problem`` in its slot."""
    if not body.strip():
        raise Problem(INVALID_INPUT, "empty body: send a JSON array or NDJSON lines of operations", field="body")
    if ndjson:
        items: list[Any] = []
        for n, line in enumerate(body.split(b"\n"), start=1):
            if not line.strip():
                continue
            if len(items) >= max_items:
                raise _too_many(max_items)
            try:
                items.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                items.append(Problem(INVALID_INPUT, f"line {n} is not valid JSON: {exc}", field=f"line {n}"))
        return items
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Problem(INVALID_INPUT, f"body is not valid JSON: {exc}", field="body") from None
    if not isinstance(parsed, list):
        raise Problem(INVALID_INPUT, "body must be a JSON array of operations (or NDJSON lines)", field="body")
    if len(parsed) > max_items:
        raise _too_many(max_items)
    return parsed


def _too_many(max_items: int) -> Problem:
    return Problem(TOO_LARGE, f"more than {max_items} operations in one request", field="body", extra={"limit": max_items})


def _bad(index: int, detail: str, field: str) -> Problem:
    return Problem(INVALID_INPUT, f"item {index}: {detail}", field=f"[{index}].{field}")


def to_op(index: int, item: Any) -> WriteOp | Problem:
    """One item as a ``WriteOp``, or the ``Problem`` explaining why it is not one."""
    if isinstance(item, Problem):
        return item
    if type(item) is not dict:
        return _bad(index, "must be an object", "")
    if not _ALLOWED.issuperset(item):
        return _bad(index, f"unknown field(s) {', '.join(sorted(set(item) - _ALLOWED))}", "")
    key = item.get("key")
    if type(key) is not str:
        return _bad(index, "key must be a string", "key")
    cas = item.get("cas")
    if cas is not None and (type(cas) is not int or not 0 <= cas < _MAX_CAS):
        return _bad(index, "cas must be an unsigned 64-bit integer", "cas")
    op = item.get("op")
    value = item.get("value", _MISSING)
    b64 = item.get("value_b64", _MISSING)
    if op == "set":
        if b64 is _MISSING:
            if value is _MISSING:
                return _bad(index, "set needs value or value_b64", "value")
            return WriteOp(Op.MUTATION, key, orjson.dumps(value), cas)
        if value is not _MISSING:
            return _bad(index, "give value or value_b64, not both", "value_b64")
        if type(b64) is not str:
            return _bad(index, "value_b64 must be a base64 string", "value_b64")
        try:
            raw = b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            return _bad(index, "value_b64 is not valid base64", "value_b64")
        return WriteOp(Op.MUTATION, key, raw, cas)
    if op == "delete":
        if value is not _MISSING or b64 is not _MISSING:
            return _bad(index, "delete takes no value", "value")
        return WriteOp(Op.DELETION, key, b"", cas)
    return _bad(index, 'op must be "set" or "delete"', "op")


_get_op = itemgetter("op")
_get_key = itemgetter("key")
_get_value = itemgetter("value")
_get_b64 = itemgetter("value_b64")
_DICT_ONLY = {dict}
_THREE = {3}
_STR_ONLY = {str}


def plain_sets(items: list[Any]) -> tuple[list[str], list[bytes]] | None:
    """Keys and value bytes when *every* item is a plain set (exactly ``op: "set"``, a string
    ``key`` and ``value``, or exactly those with a valid ``value_b64``), else None.

    WHY: that is what bulk loaders send, and then the checks run as C-level passes over the
    whole batch (``map`` of item getters, one ``set`` of types) instead of a Python loop per
    item: measured in the bulk breakdown (docs/benchmarks.md).  Anything else, even one item,
    returns None and the caller takes the per-item path, which owns the error messages; a
    table test checks that both build the same operations."""
    n = len(items)
    if not n or set(map(type, items)) != _DICT_ONLY or set(map(len, items)) != _THREE:
        return None
    try:
        if list(map(_get_op, items)).count("set") != n:
            return None
        keys = list(map(_get_key, items))
        if set(map(type, keys)) != _STR_ONLY:
            return None
        if "value" in items[0]:
            return keys, list(map(orjson.dumps, map(_get_value, items)))
        b64s = list(map(_get_b64, items))
        if set(map(type, b64s)) != _STR_ONLY:
            return None
        # = b64decode(validate=True), one call less per item
        return keys, [a2b_base64(b64, strict_mode=True) for b64 in b64s]
    except (KeyError, binascii.Error, ValueError):  # an item without the field, bad base64
        return None


def apply(engine: BatchWriter, items: list[Any], durability: str,
          columns: bool = False) -> tuple[dict[str, Any], dict[int, int]]:
    """Write every valid item in one engine batch.

    Returns the response body (per-item ``results`` objects, or with ``columns`` the
    column form: see ``column_body``) and the highest seqno written per partition (the
    targets of the batch's single durability wait).

    WHY two ways to build the operations: ``plain_sets`` handles batches made only of plain
    sets in C-level passes; otherwise each item is looked at in turn, and the common ones
    (``{"op": "set", "key": str, "value": ...}``, the same with ``value_b64``) are still
    recognised inline without a ``to_op`` call (three fields, two of them ``op`` and ``key``
    with the right types, leave nothing for ``to_op`` to refuse).  Everything else goes
    through ``to_op``, which owns the error messages."""
    n = len(items)
    refused: dict[int, dict[str, Any]] = {}
    plain = plain_sets(items)
    if plain is not None:
        keys, values = plain
        # plain (op, key, value, cas) tuples: the engine unpacks them like WriteOps; building
        # WriteOp instances as well cost ≈ 0.1 µs per item (docs/benchmarks.md)
        ops = list(zip(repeat(Op.MUTATION, n), keys, values, repeat(None, n)))
        slots: list[int] | range = range(n)
    else:
        ops, slots = _ops_one_by_one(items, refused)
    written = engine.write_batch(ops) if ops else []
    all_ok = not refused and set(map(type, written)) <= _OK_ONLY  # the usual case
    ok = written if all_ok else [r for r in written if type(r) is WriteResult]
    # seqnos ascend within a partition in one batch, so the last success per partition is its
    # highest: dict() of (partition, seqno) pairs keeps exactly that, in one C-level pass
    targets: dict[int, int] = dict(zip(map(_partition_of, ok), map(_seqno_of, ok)))
    head = {"durability": durability, "succeeded": len(ok), "failed": n - len(ok)}
    if columns:
        return {**head, **column_body(items, n, slots, written, refused, all_ok)}, targets
    return {**head, "results": _result_objects(items, n, slots, written, refused)}, targets


_OK_ONLY = {WriteResult}


def _ops_one_by_one(items: list[Any], refused: dict[int, dict[str, Any]]) -> tuple[list[WriteOp], list[int]]:
    """The operations of the valid items and their indexes; refused items' results go to ``refused``."""
    ops: list[WriteOp] = []
    slots: list[int] = []
    add_op = ops.append
    add_slot = slots.append
    new = tuple.__new__
    dumps = orjson.dumps
    mutation = Op.MUTATION
    for i, item in enumerate(items):
        if type(item) is dict and len(item) == 3 and item.get("op") == "set":
            key = item.get("key")
            if type(key) is str:
                value = item.get("value", _MISSING)
                if value is not _MISSING:
                    add_op(new(WriteOp, (mutation, key, dumps(value), None)))
                    add_slot(i)
                    continue
                b64 = item.get("value_b64")
                if type(b64) is str:
                    try:
                        raw = a2b_base64(b64, strict_mode=True)  # = b64decode(validate=True), one call less
                    except (binascii.Error, ValueError):
                        pass  # to_op reports it
                    else:
                        add_op(new(WriteOp, (mutation, key, raw, None)))
                        add_slot(i)
                        continue
        op = to_op(i, item)
        if type(op) is WriteOp:
            add_op(op)
            add_slot(i)
        else:
            refused[i] = {"index": i, "status": op.status, "error": op.body()}  # type: ignore[union-attr]
    return ops, slots


def _failed(i: int, items: list[Any], err: UprError) -> dict[str, Any]:
    body = item_error(err)
    return {"index": i, "status": body["status"], "key": items[i]["key"], "error": body}


def _result_objects(items: list[Any], n: int, slots: Sequence[int], written: list[WriteResult | UprError],
                    refused: dict[int, dict[str, Any]]) -> list[dict[str, Any] | None]:
    results: list[dict[str, Any] | None] = [None] * n
    for i, body in refused.items():
        results[i] = body
    for i, res in zip(slots, written):
        if type(res) is WriteResult:
            key, p, seqno, cas, rev, deleted = res
            results[i] = {"index": i, "status": 200, "key": key, "partition": p, "seqno": seqno,
                          "cas": cas, "rev": rev, "deleted": deleted}
        else:
            results[i] = _failed(i, items, res)  # type: ignore[arg-type]
    return results


COLUMNS = ("status", "partition", "seqno", "cas", "rev", "deleted")


def column_body(items: list[Any], n: int, slots: Sequence[int], written: list[WriteResult | UprError],
                refused: dict[int, dict[str, Any]], all_ok: bool) -> dict[str, Any]:
    """``columns``: one array per field, element ``i`` for item ``i`` (``status`` 200, or the
    status the item alone would have had; the other fields null for a failed item), and
    ``errors``: ``{"index", "status", "key"?, "error"}`` of each failed item, in item order.

    WHY: 1000 result objects cost the writer thread ≈ 0.3 µs per item to build and encode,
    and a client ≈ 0.7 µs per item to decode, against ≈ 0.1 µs and ≈ 0.15 µs for six arrays
    of numbers (measured, docs/benchmarks.md); the key is left out since the caller sent it."""
    if all_ok:
        _keys, parts, seqnos, cas, revs, deleted = zip(*written) if written else ((),) * 6
        return {"columns": {"status": [200] * n, "partition": parts, "seqno": seqnos, "cas": cas, "rev": revs,
                            "deleted": deleted}, "errors": []}
    cols: dict[str, list[Any]] = {name: [None] * n for name in COLUMNS}
    status, part_c, seq_c, cas_c, rev_c, del_c = cols.values()
    errors: dict[int, dict[str, Any]] = dict(refused)
    for i, body in refused.items():
        status[i] = body["status"]
    for i, res in zip(slots, written):
        if type(res) is WriteResult:
            status[i] = 200
            _key, part_c[i], seq_c[i], cas_c[i], rev_c[i], del_c[i] = res
        else:
            errors[i] = _failed(i, items, res)  # type: ignore[arg-type]
            status[i] = errors[i]["status"]
    return {"columns": cols, "errors": [errors[i] for i in sorted(errors)]}
