"""A small asyncio client for etcd's v3 JSON gateway, over httpx.

Why the gateway rather than a gRPC client: httpx is already a dependency, the gateway serves
every call the cluster needs (kv, txn, leases, watch), and of the Python gRPC clients measured
here one does not import with current protobuf and one loses lease ids
(../shared/notes/cluster.md §6).  The gateway's JSON is proto3's: keys and values are base64,
int64s are strings and fields equal to their zero value are left out, which ``_int`` and
``_kv`` absorb.

Endpoints are tried in order; a connection failure moves to the next one and, when all have
failed, raises ``EtcdUnavailable`` (retriable).  An answer of etcd's own (a lease not found,
a compacted revision) raises ``EtcdError`` with etcd's message.
"""
from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx


class EtcdError(Exception):
    """etcd answered with an error; ``message`` is etcd's."""

    retriable = False

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered: etcd is down or unreachable from here."""

    retriable = True


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction: ``target`` of ``key`` compared with ``value``."""

    key: bytes
    target: Literal["create", "mod", "version", "value", "lease"]
    value: int | bytes
    result: Literal["equal", "greater", "less", "not_equal"] = "equal"

    def to_json(self) -> dict[str, Any]:
        field = {"create": "create_revision", "mod": "mod_revision"}.get(self.target, self.target)
        value = _b64(self.value) if isinstance(self.value, bytes) else str(self.value)
        return {"key": _b64(self.key), "target": self.target.upper(), "result": self.result.upper(), field: value}


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": _b64(self.key), "value": _b64(self.value)}
        if self.lease:
            body["lease"] = str(self.lease)
        return {"request_put": body}


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes

    def to_json(self) -> dict[str, Any]:
        return {"request_delete_range": {"key": _b64(self.key)}}


@dataclass(frozen=True, slots=True)
class Get:
    key: bytes

    def to_json(self) -> dict[str, Any]:
        return {"request_range": {"key": _b64(self.key)}}


TxnOp = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    #: the key-values read by ``Get`` operations of the branch that ran, in order.
    reads: tuple[tuple[KeyValue, ...], ...]


class EtcdClient:
    """One client for the life of a node; ``aclose`` ends its connections."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self._http = httpx.AsyncClient(timeout=timeout)
        #: requests sent (calls and streams opened), for ``/metrics``: what the control plane costs
        self.requests = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ kv
    async def get(self, key: bytes) -> KeyValue | None:
        kvs, _ = await self._range({"key": _b64(key)})
        return kvs[0] if kvs else None

    async def get_prefix(self, prefix: bytes) -> tuple[tuple[KeyValue, ...], int]:
        """Every key under ``prefix`` and the store revision they were read at."""
        return await self._range({"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        body = Put(key, value, lease).to_json()["request_put"]
        answer = await self._call("/v3/kv/put", body)
        return _int(answer.get("header", {}).get("revision"))

    async def delete(self, key: bytes) -> int:
        answer = await self._call("/v3/kv/deleterange", {"key": _b64(key)})
        return _int(answer.get("deleted"))

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()
    ) -> TxnResult:
        answer = await self._call("/v3/kv/txn", txn_body(compare, success, failure))
        return txn_result(answer)

    # ------------------------------------------------------------------ leases
    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: (id, the TTL etcd granted, which may be longer than asked)."""
        answer = await self._call("/v3/lease/grant", {"TTL": ttl})
        if answer.get("error"):
            raise EtcdError(str(answer["error"]))
        return _int(answer.get("ID")), _int(answer.get("TTL"))

    async def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; the TTL left after it, 0 when the lease has already expired."""
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease)}, stream_first=True)
        return _int(answer.get("result", answer).get("TTL"))

    async def revoke(self, lease: int) -> None:
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if "not found" not in exc.message:
                raise

    # ------------------------------------------------------------------ watch
    async def watch_prefix(self, prefix: bytes, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Every change under ``prefix`` from ``start_revision`` on, until the connection ends.

        Re-watching after a lost connection is the caller's, from the revision after the last
        event it saw, so no change is missed between the two watches.
        """
        request = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
            }
        }
        async for message in self._stream("/v3/watch", request):
            result = message.get("result", {})
            if result.get("compact_revision"):
                raise EtcdError(f"watch start revision {start_revision} was compacted")
            for event in result.get("events", []):
                yield WatchEvent("delete" if event.get("type") == "DELETE" else "put", _kv(event["kv"]))

    # ------------------------------------------------------------------ transport
    async def _range(self, body: dict[str, Any]) -> tuple[tuple[KeyValue, ...], int]:
        answer = await self._call("/v3/kv/range", body)
        kvs = tuple(_kv(kv) for kv in answer.get("kvs", []))
        return kvs, _int(answer.get("header", {}).get("revision"))

    async def _call(self, path: str, body: dict[str, Any], *, stream_first: bool = False) -> dict[str, Any]:
        if stream_first:
            async for message in self._stream(path, body):
                return message
            raise EtcdUnavailable(f"etcd closed {path} without an answer")
        last: Exception | None = None
        self.requests += 1
        for endpoint in self.endpoints:
            try:
                response = await self._http.post(endpoint + path, json=body)
            except httpx.TransportError as exc:
                last = exc
                continue
            return checked(response.json(), path)
        raise EtcdUnavailable(f"no etcd endpoint answered ({', '.join(self.endpoints)}): {last}")

    async def _stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        last: Exception | None = None
        self.requests += 1
        for endpoint in self.endpoints:
            try:
                async with self._http.stream("POST", endpoint + path, json=body, timeout=None) as response:
                    async for line in response.aiter_lines():
                        if line.strip():
                            yield checked(json.loads(line), path)
                    return
            except httpx.TransportError as exc:
                last = exc
                continue
        raise EtcdUnavailable(f"no etcd endpoint answered ({', '.join(self.endpoints)}): {last}")


def txn_body(compare: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]) -> dict[str, Any]:
    """The gateway's JSON for a transaction."""
    return {
        "compare": [c.to_json() for c in compare],
        "success": [op.to_json() for op in success],
        "failure": [op.to_json() for op in failure],
    }


def txn_result(answer: dict[str, Any]) -> TxnResult:
    """A transaction's answer (already ``checked``) as a ``TxnResult``."""
    reads = tuple(
        tuple(_kv(kv) for kv in response["response_range"].get("kvs", []))
        for response in answer.get("responses", [])
        if "response_range" in response
    )
    return TxnResult(bool(answer.get("succeeded", False)), _int(answer.get("header", {}).get("revision")), reads)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key after every key starting with ``prefix`` (etcd's range_end)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return b"\x00"
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def checked(answer: dict[str, Any], path: str) -> dict[str, Any]:
    """``answer`` itself, or the ``EtcdError`` it carries raised."""
    error = answer.get("error")
    if isinstance(error, dict):
        raise EtcdError(f"{path}: {error.get('message', error)}", code=error.get("grpc_code"))
    if isinstance(error, str) and "code" in answer:
        raise EtcdError(f"{path}: {answer.get('message', error)}", code=answer.get("code"))
    return answer


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(raw.get("key", "")),
        value=base64.b64decode(raw.get("value", "")),
        create_revision=_int(raw.get("create_revision")),
        mod_revision=_int(raw.get("mod_revision")),
        version=_int(raw.get("version")),
        lease=_int(raw.get("lease")),
    )
