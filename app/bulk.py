"""Parsing and applying ``POST /docs/_bulk`` bodies: pure functions, no I/O.

WHY not pydantic models per item: on this machine parsing 1000-item bodies through
pydantic halves bulk throughput compared to orjson plus the few checks below.  Each item
is checked here (shape, op, value vs value_b64, cas); the engine checks keys and sizes.
A bad item gets its own error result and never stops the others.

Accepted bodies: a JSON array of items, or NDJSON (one item per line; a line that is not
valid JSON is an error for that line only).

A JSON ``value`` is stored as the client's own text of it, exactly as sent (whitespace and
escapes included, from its first to its last character), not re-encoded: that is valid JSON of
the same value, like a ``PUT`` body, and it saves decoding every value into Python objects and
encoding it back (``decode``: msgspec's ``Raw`` hands out the value's bytes without building
objects).  The body must be UTF-8 (checked once for the whole body).
"""
from __future__ import annotations

import binascii
import contextlib
import gc
from base64 import b64decode
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, Literal, NamedTuple, Protocol

import msgspec
import orjson

from app.problems import INVALID_INPUT, TOO_LARGE, Problem, item_error
from engine.core.errors import UprError
from engine.core.types import Op, WriteOp, WriteResult

NDJSON_TYPES = ("ndjson", "jsonl", "json-seq", "x-json-stream")
_ALLOWED = frozenset(("op", "key", "value", "value_b64", "cas"))
_MISSING = object()
_MAX_CAS = 1 << 64
_partition_of = itemgetter(1)  # WriteResult.partition
_seqno_of = itemgetter(2)  # WriteResult.seqno


class _PlainValueSet(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly ``{"op": "set", "key": <str>, "value": <JSON>}``: the common bulk item."""
    op: Literal["set"]
    key: str
    value: msgspec.Raw


class _PlainB64Set(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly ``{"op": "set", "key": <str>, "value_b64": <base64>}``; msgspec decodes the base64
    (strictly, as ``b64decode(validate=True)``: a test compares them)."""
    op: Literal["set"]
    key: str
    value_b64: bytes


class _ValueOf(msgspec.Struct):
    """Only an item's ``value`` text (empty when absent); other fields are ignored here."""
    value: msgspec.Raw = msgspec.Raw()


_DECODE_PLAIN_ARRAY = msgspec.json.Decoder(list[_PlainValueSet]).decode
_DECODE_PLAIN_LINE = msgspec.json.Decoder(_PlainValueSet).decode
_DECODE_PLAIN_B64_ARRAY = msgspec.json.Decoder(list[_PlainB64Set]).decode
_DECODE_PLAIN_B64_LINE = msgspec.json.Decoder(_PlainB64Set).decode
_DECODE_VALUES = msgspec.json.Decoder(list[_ValueOf]).decode
_DECODE_VALUE = msgspec.json.Decoder(_ValueOf).decode
_DECODE_RAWS = msgspec.json.Decoder(list[msgspec.Raw]).decode
_MSGSPEC_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)
_key_of = attrgetter("key")
_value_of = attrgetter("value")
_b64_of = attrgetter("value_b64")


class PlainSets(NamedTuple):
    """A body made only of plain sets: keys and values, in item order."""
    keys: list[str]
    values: list[bytes]


class BatchWriter(Protocol):
    def write_batch(self, ops: Sequence[tuple[Op, str, bytes, int | None]]) -> list[WriteResult | UprError]: ...


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while one request's items are parsed and written.

    WHY: a decoded body with JSON-object values is thousands of young containers, and the
    allocations that follow (one ``WriteOp`` per item, the results) trigger collections that
    traverse them again, a measurable share of the server's CPU per mutation for 1000-item
    batches of small JSON objects (docs/benchmarks.md, HTTP: bulk breakdown; none for
    ``value_b64``).  Nothing here
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


class Batch(NamedTuple):
    """A parsed body: the operations to write and what became of every item.

    ``ops`` are plain ``(op, key, value, cas)`` tuples (the engine unpacks them like
    ``WriteOp``s, which they may also be); ``slots[j]`` is the item index of ``ops[j]``;
    ``refused`` maps the index of each item refused before the engine to its result."""
    size: int
    ops: list[tuple[Op, str, bytes, int | None]]
    slots: Sequence[int]
    refused: dict[int, dict[str, Any]]


def decode(body: bytes, ndjson: bool, max_items: int) -> Batch:
    """The body as a ``Batch``, parsed along one path that first tries the whole body as plain
    sets and otherwise looks at each item.

    Plain sets are the bodies in which every item is exactly ``{"op": "set", "key": <str>,
    "value": <JSON>}``, or every one exactly the same with ``"value_b64"``.  WHY a typed pass
    for them: one msgspec decode of such a body (the common bulk load) yields the keys and each
    value's own text with no Python object per value, about half the cost of orjson's decode
    plus ``orjson.dumps`` of each value, for JSON values and ``value_b64`` alike (see
    docs/benchmarks.md, HTTP: ``bench_http --breakdown``).
    Any other body (another shape, any error) goes item by item through ``parse_items`` and
    ``to_op``, which own the error messages and store values the same way (their text as sent),
    so the typed pass never has to decide anything a second time."""
    plain = plain_sets(body, ndjson)
    if plain is None or not plain.keys:  # also an empty array or body: parse_items answers those
        return batch_of(parse_items(body, ndjson, max_items))
    n = len(plain.keys)
    if n > max_items:
        raise _too_many(max_items)
    return Batch(n, list(zip(repeat(Op.MUTATION, n), plain.keys, plain.values, repeat(None, n))), range(n), {})


def batch_of(items: list[Any]) -> Batch:
    """The ``Batch`` of decoded items (``parse_items``' output): each through ``to_op``."""
    ops: list[tuple[Op, str, bytes, int | None]] = []
    slots: list[int] = []
    refused: dict[int, dict[str, Any]] = {}
    for i, item in enumerate(items):
        op = to_op(i, item)
        if type(op) is WriteOp:
            ops.append(op)
            slots.append(i)
        else:
            refused[i] = {"index": i, "status": op.status, "error": op.body()}  # type: ignore[union-attr]
    return Batch(len(items), ops, slots, refused)


def plain_sets(body: bytes, ndjson: bool) -> PlainSets | None:
    """The typed pass of ``decode``: the body's keys and values if it is made only of plain
    sets (one of the two shapes throughout), else None (the items then go one by one)."""
    if not body.isascii():
        try:
            body.decode()  # msgspec does not check the UTF-8 of the text it hands out as Raw
        except UnicodeDecodeError:
            return None
    b64 = b'"value_b64"' in body  # which of the two plain shapes to try (a batch of both is neither)
    try:
        if not ndjson:
            plain = (_DECODE_PLAIN_B64_ARRAY if b64 else _DECODE_PLAIN_ARRAY)(body)
        else:
            lines = body.split(b"\n")
            if lines and not lines[-1].strip():
                lines.pop()  # the usual final newline; any other blank line sends the body item by item
            # one decode per line, not decode_lines: that reads values across line breaks, and a
            # line must stand alone (a bad line is that line's error)
            plain = list(map(_DECODE_PLAIN_B64_LINE if b64 else _DECODE_PLAIN_LINE, lines))
    except _MSGSPEC_ERRORS:
        return None
    if b64:
        return PlainSets(list(map(_key_of, plain)), list(map(_b64_of, plain)))
    return PlainSets(list(map(_key_of, plain)), list(map(bytes, map(_value_of, plain))))


def value_text(value: Any) -> bytes:
    """The stored bytes of a JSON ``value``: its text as sent (``Raw``), or, for an item built
    in Python rather than decoded from a body, its compact JSON encoding."""
    return bytes(value) if type(value) is msgspec.Raw else orjson.dumps(value)


def parse_items(body: bytes, ndjson: bool, max_items: int) -> list[Any]:
    """The decoded items; a line that is not JSON becomes a ``Problem`` in its slot.  An
    object's ``value`` is a ``msgspec.Raw`` of its text as sent (see ``value_text``)."""
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
                item = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                items.append(Problem(INVALID_INPUT, f"line {n} is not valid JSON: {exc}", field=f"line {n}"))
                continue
            if type(item) is dict and "value" in item:
                with contextlib.suppress(*_MSGSPEC_ERRORS):
                    item["value"] = _DECODE_VALUE(line).value
            items.append(item)
        return items
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Problem(INVALID_INPUT, f"body is not valid JSON: {exc}", field="body") from None
    if not isinstance(parsed, list):
        raise Problem(INVALID_INPUT, "body must be a JSON array of operations (or NDJSON lines)", field="body")
    if len(parsed) > max_items:
        raise _too_many(max_items)
    _raw_values(body, parsed)
    return parsed


def _raw_values(body: bytes, items: list[Any]) -> None:
    """Replace each object item's ``value`` by its text as sent (a ``msgspec.Raw``)."""
    if not any(type(item) is dict and "value" in item for item in items):
        return
    try:
        texts = list(map(_value_of, _DECODE_VALUES(body)))
    except _MSGSPEC_ERRORS:  # an item that is not an object: look at each one
        try:
            raws = _DECODE_RAWS(body)
        except _MSGSPEC_ERRORS:  # not seen: orjson took the body; its values then get dumped
            return
        texts = []
        for raw in raws:
            try:
                texts.append(_DECODE_VALUE(raw).value)
            except _MSGSPEC_ERRORS:
                texts.append(msgspec.Raw())
    for item, text in zip(items, texts):
        if text and type(item) is dict and "value" in item:
            item["value"] = text


def _too_many(max_items: int) -> Problem:
    return Problem(TOO_LARGE, f"more than {max_items} operations in one request", field="body", extra={"limit": max_items})


def _bad(index: int, detail: str, field: str = "") -> Problem:
    """An item's problem, its ``field`` the JSON path of the culprit: ``[3].key``, or ``[3]``
    when the whole item is wrong."""
    return Problem(INVALID_INPUT, f"item {index}: {detail}", field=f"[{index}].{field}" if field else f"[{index}]")


def to_op(index: int, item: Any) -> WriteOp | Problem:
    """One item as a ``WriteOp``, or the ``Problem`` explaining why it is not one."""
    if isinstance(item, Problem):
        return item
    if type(item) is not dict:
        return _bad(index, "must be an object")
    if not _ALLOWED.issuperset(item):
        return _bad(index, f"unknown field(s) {', '.join(sorted(set(item) - _ALLOWED))}")
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
            return WriteOp(Op.MUTATION, key, value_text(value), cas)
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


def refuse_impossible(batch: Batch, partition_of: Callable[[str], int], impossible: Mapping[int, Exception]) -> None:
    """Raise the refusal (the cluster's ``DurabilityImpossible``) of the first operation whose
    partition is in ``impossible`` (its live copies cannot form a majority): the whole batch is
    refused before anything is written, as one durability wait covers the whole batch.  Costs a
    key hash per operation, so the caller asks only when some partition is impossible."""
    for op in batch.ops:
        refusal = impossible.get(partition_of(op[1]))
        if refusal is not None:
            raise refusal


def apply(engine: BatchWriter, batch: Batch, durability: str,
          columns: bool = False) -> tuple[dict[str, Any], dict[int, int]]:
    """Write the batch's operations in one engine batch.

    Returns the response body (per-item ``results`` objects, or with ``columns`` the
    column form: see ``column_body``) and the highest seqno written per partition (the
    targets of the batch's single durability wait)."""
    n, ops, slots, refused = batch
    written = engine.write_batch(ops) if ops else []
    all_ok = not refused and set(map(type, written)) <= _OK_ONLY  # the usual case
    ok = written if all_ok else [r for r in written if type(r) is WriteResult]
    # seqnos ascend within a partition in one batch, so the last success per partition is its
    # highest: dict() of (partition, seqno) pairs keeps exactly that, in one C-level pass
    targets: dict[int, int] = dict(zip(map(_partition_of, ok), map(_seqno_of, ok)))
    head = {"durability": durability, "succeeded": len(ok), "failed": n - len(ok)}
    if columns:
        return {**head, **column_body(batch, written, all_ok)}, targets
    return {**head, "results": _result_objects(batch, written)}, targets


_OK_ONLY = {WriteResult}


def _failed(i: int, key: str, err: UprError) -> dict[str, Any]:
    body = item_error(err)
    return {"index": i, "status": body["status"], "key": key, "error": body}


def _result_objects(batch: Batch, written: list[WriteResult | UprError]) -> list[dict[str, Any] | None]:
    results: list[dict[str, Any] | None] = [None] * batch.size
    for i, body in batch.refused.items():
        results[i] = body
    for i, op, res in zip(batch.slots, batch.ops, written):
        if type(res) is WriteResult:
            key, p, seqno, cas, rev, deleted = res
            results[i] = {"index": i, "status": 200, "key": key, "partition": p, "seqno": seqno,
                          "cas": cas, "rev": rev, "deleted": deleted}
        else:
            results[i] = _failed(i, op[1], res)  # type: ignore[arg-type]
    return results


COLUMNS = ("status", "partition", "seqno", "cas", "rev", "deleted")


def column_body(batch: Batch, written: list[WriteResult | UprError], all_ok: bool) -> dict[str, Any]:
    """``columns``: one array per field, element ``i`` for item ``i`` (``status`` 200, or the
    status the item alone would have had; the other fields null for a failed item), and
    ``errors``: ``{"index", "status", "key"?, "error"}`` of each failed item, in item order.

    WHY: six arrays of numbers cost the writer thread a third and a client a fifth of what one
    result object per item costs to build, encode and decode (see docs/benchmarks.md, HTTP:
    ``results=columns``); the key is left out since the caller sent it."""
    n = batch.size
    if all_ok:
        _keys, parts, seqnos, cas, revs, deleted = zip(*written) if written else ((),) * 6
        return {"columns": {"status": [200] * n, "partition": parts, "seqno": seqnos, "cas": cas, "rev": revs,
                            "deleted": deleted}, "errors": []}
    cols: dict[str, list[Any]] = {name: [None] * n for name in COLUMNS}
    status, part_c, seq_c, cas_c, rev_c, del_c = cols.values()
    errors: dict[int, dict[str, Any]] = dict(batch.refused)
    for i, body in batch.refused.items():
        status[i] = body["status"]
    for i, op, res in zip(batch.slots, batch.ops, written):
        if type(res) is WriteResult:
            status[i] = 200
            _key, part_c[i], seq_c[i], cas_c[i], rev_c[i], del_c[i] = res
        else:
            errors[i] = _failed(i, op[1], res)  # type: ignore[arg-type]
            status[i] = errors[i]["status"]
    return {"columns": cols, "errors": [errors[i] for i in sorted(errors)]}
