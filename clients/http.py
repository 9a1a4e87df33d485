"""The HTTP API as the client needs it: documents, partitions, status.  Sync and async flavours.

The consumer uses ``AsyncHttpApi.get`` to re-read keys for rollback corrections; the CLI uses
``HttpApi``; restore tools write through ``bulk`` (``POST /docs/_bulk``: one request, one durability
wait, one result per operation; a refused item does not stop the others, so callers check
``results``).  Both flavours offer the same reads and writes.  Every failure becomes one typed error (``clients.errors``): unreachable server ->
``ConnectionFailed``, 401/403 -> ``AuthFailed``, other problems -> ``HttpError`` carrying the
problem's status and detail, so callers never parse text.

In a cluster, ``server`` may name several nodes (``URL[,URL...]``): a call goes to the first that
accepts a connection, and a document call (``get``/``put``/``delete``) follows ``421
misdirected-request`` answers to the active node they name and asks again after a ``503
partition-not-active`` (the partition is changing hands), a bounded number of hops
(``clients.redirects.DocumentRoute``).
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import orjson

from engine.core.types import Document

from .errors import AuthFailed, ConnectionFailed, HttpError
from .h1 import Response as H1Response
from .h1_pool import ConnectFailed, ExchangeFailed, H1Pool

#: an answer from either transport: the attributes this module reads are the same
Answer = httpx.Response | H1Response
from .redirects import MAX_HOPS, DocumentRoute, parse_servers

__all__ = ["DEFAULT_SERVER", "HttpApi", "AsyncHttpApi", "bulk_body", "default_server", "default_token", "doc_path"]

DEFAULT_SERVER = "http://127.0.0.1:8000"


def default_server() -> str:
    return os.environ.get("UPR_SERVER") or DEFAULT_SERVER


def default_token() -> str | None:
    return os.environ.get("UPR_TOKEN") or None


def doc_path(key: str) -> str:
    return "/docs/" + quote(key, safe="")


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _raise_for(resp: Answer, what: str) -> None:
    if resp.status_code < 400:
        return
    detail, code, field, partition = resp.reason_phrase, None, None, None
    try:
        body = resp.json()
        if isinstance(body, dict):
            detail = body.get("detail") or body.get("title") or detail
            code = (body.get("type") or "").rsplit("/", 1)[-1] or None
            field, partition = body.get("field"), body.get("partition")
    except ValueError:
        pass
    message = f"{what}: HTTP {resp.status_code}: {detail}"
    if resp.status_code in (401, 403):
        raise AuthFailed(message, field="token")
    raise HttpError(message, status=resp.status_code, server_code=code, field=field, partition=partition)


def _problem_body(resp: Answer) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def _unreachable(what: str, servers: tuple[str, ...], exc: Exception) -> ConnectionFailed:
    where = servers[0] if len(servers) == 1 else f"any of {', '.join(servers)}"
    return ConnectionFailed(f"{what}: cannot reach {where}: {exc or type(exc).__name__}")


def _document(what: str, key: str, resp: Answer) -> Document | None:
    if resp.status_code == 404:
        return None
    _raise_for(resp, what)
    h = resp.headers
    return Document(key, int(h["x-upr-partition"]), int(h["x-upr-seqno"]), int(h["x-upr-cas"]),
                    int(h.get("x-upr-rev", 0)), False, resp.content)


def _write_params(durability: str | None) -> dict[str, str]:
    return {"durability": durability} if durability else {}


def _bulk_params(durability: str | None, columns: bool) -> dict[str, str]:
    return {**_write_params(durability), "results": "columns"} if columns else _write_params(durability)


def _cas_header(cas: int | None) -> dict[str, str]:
    return {"If-Match": f'"{cas}"'} if cas is not None else {}


BULK_PATH = "/docs/_bulk"


def bulk_body(ops: Iterable[Mapping[str, Any]], *, ndjson: bool = False) -> tuple[bytes, dict[str, str]]:
    """The body and content type of a bulk request.  ``ops`` are the server's bulk items:
    ``{"op": "set"|"delete", "key": K, "value": <JSON> | "value_b64": <base64>, "cas": N?}``.
    NDJSON (one operation per line) lets a caller stream operations it produces line by line."""
    if ndjson:
        body = b"".join(orjson.dumps(op) + b"\n" for op in ops)
        return body, {"Content-Type": "application/x-ndjson"}
    return orjson.dumps(list(ops)), {"Content-Type": "application/json"}


class HttpApi:
    """Blocking client (CLI, scripts).  ``with HttpApi(url, token) as api: api.get("k")``."""

    def __init__(self, server: str | None = None, token: str | None = None, *, timeout: float = 10.0,
                 max_hops: int = MAX_HOPS) -> None:
        self.servers = parse_servers(server or default_server())
        self.server = self.servers[0]
        self.max_hops = max_hops
        self._client = httpx.Client(headers=_headers(token), timeout=timeout)

    def _call(self, method: str, path: str, what: str, **kw: Any) -> httpx.Response:
        """The first server that accepts a connection answers (later ones only when nothing was sent)."""
        for i, server in enumerate(self.servers):
            try:
                resp = self._client.request(method, server + path, **kw)
            except httpx.ConnectError as exc:
                if i + 1 < len(self.servers):
                    continue
                raise _unreachable(what, self.servers, exc) from None
            except httpx.TransportError as exc:
                raise _unreachable(what, (server,), exc) from None
            self.server = server
            return resp
        raise AssertionError("unreachable: parse_servers never returns an empty tuple")

    def _routed(self, method: str, path: str, what: str, **kw: Any) -> tuple[httpx.Response, str]:
        """``_call``, then the hops ``DocumentRoute`` asks for (421s followed, 503
        partition-not-active retried), at most ``max_hops`` of them."""
        resp = self._call(method, path, what, **kw)
        route = DocumentRoute(self.server, self.max_hops)
        while hop := route.next(resp.status_code, _problem_body(resp)):
            time.sleep(hop.delay)
            try:
                resp = self._client.request(method, hop.url + path, **kw)
            except httpx.TransportError as exc:
                raise _unreachable(f"{what} (sent on to {hop.url})", (hop.url,), exc) from None
        return resp, route.describe(what)

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._call(method, path, f"{method} {path}", **kw)
        _raise_for(resp, f"{method} {path}")
        return resp.json()

    def _doc_json(self, method: str, key: str, **kw: Any) -> Any:
        resp, what = self._routed(method, doc_path(key), f"{method} {key!r}", **kw)
        _raise_for(resp, what)
        return resp.json()

    def get(self, key: str) -> Document | None:
        resp, what = self._routed("GET", doc_path(key), f"GET {key!r}")
        return _document(what, key, resp)

    def put(self, key: str, value: bytes, *, cas: int | None = None, durability: str | None = None) -> dict[str, Any]:
        return self._doc_json("PUT", key, content=value, params=_write_params(durability),
                              headers={"Content-Type": "application/octet-stream", **_cas_header(cas)})

    def delete(self, key: str, *, cas: int | None = None, durability: str | None = None) -> dict[str, Any]:
        return self._doc_json("DELETE", key, params=_write_params(durability), headers=_cas_header(cas))

    def bulk(self, ops: Iterable[Mapping[str, Any]], *, durability: str | None = None,
             ndjson: bool = False, columns: bool = False) -> dict[str, Any]:
        """``POST /docs/_bulk``: ``{"results": [{"status": 200, ...} | {"status": N, "error": ...}],
        "succeeded": n, "failed": n}``, one result per operation in order (see ``bulk_body``).
        With ``columns``: ``{"columns": {"status": [...], "partition": [...], "seqno": [...], "cas": [...],
        "rev": [...], "deleted": [...]}, "errors": [<failed items' results>], ...}``, element ``i`` of
        each column for operation ``i``: far cheaper to produce and decode for large batches."""
        body, headers = bulk_body(ops, ndjson=ndjson)
        return self._json("POST", BULK_PATH, content=body, params=_bulk_params(durability, columns), headers=headers)

    def partitions(self) -> list[dict[str, Any]]:
        return self._json("GET", "/partitions")["partitions"]

    def partition(self, partition: int) -> dict[str, Any]:
        return self._json("GET", f"/partitions/{partition}")

    def status(self) -> dict[str, Any]:
        return self._json("GET", "/status")

    def cluster(self) -> dict[str, Any]:
        """``GET /cluster``: nodes, the partition map with replica progress, the orchestrator."""
        return self._json("GET", "/cluster")

    def start_failover(self, node: str, *, force: bool = False) -> dict[str, Any]:
        """``POST /cluster/failover``: ask for a graceful failover of ``node``; its first status."""
        return self._json("POST", "/cluster/failover", json={"node": node, "force": force})

    def failover_status(self, node: str) -> dict[str, Any]:
        """``GET /cluster/failover/{node}``: the request, the partitions still active, handovers in flight."""
        return self._json("GET", f"/cluster/failover/{quote(node, safe='')}")

    def withdraw_failover(self, node: str) -> dict[str, Any]:
        """``DELETE /cluster/failover/{node}``: partitions not yet handed over take writes again."""
        return self._json("DELETE", f"/cluster/failover/{quote(node, safe='')}")

    def start_rebalance(self, *, remove: Iterable[str] = (), add: Iterable[str] = ()) -> dict[str, Any]:
        """``POST /cluster/rebalance``: spread the partitions (removing/adding nodes); its first status."""
        return self._json("POST", "/cluster/rebalance", json={"remove": list(remove), "add": list(add)})

    def rebalance_status(self) -> dict[str, Any]:
        """``GET /cluster/rebalance``: the run in progress, moved / remaining, takeovers, copies built."""
        return self._json("GET", "/cluster/rebalance")

    def stop_rebalance(self) -> dict[str, Any]:
        """``DELETE /cluster/rebalance``: moves in flight wind down; what moved stays moved."""
        return self._json("DELETE", "/cluster/rebalance")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "HttpApi":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_CONNECT_ERRORS = (httpx.ConnectError, ConnectFailed)
_TRANSPORT_ERRORS = (httpx.TransportError, ExchangeFailed, ConnectFailed)


class AsyncHttpApi:
    """Non-blocking client used inside the consumer's event loop, and the async writer's.

    Requests to ``http://`` servers go over ``clients.h1_pool``'s keep-alive connections (WHY:
    a small write's client CPU, ``clients.h1``); ``https://`` ones, or every one with
    ``lean=False``, through ``httpx``.  Both give the same answers and the same typed errors."""

    def __init__(self, server: str | None = None, token: str | None = None, *, timeout: float = 10.0,
                 max_hops: int = MAX_HOPS, lean: bool = True) -> None:
        self.servers = parse_servers(server or default_server())
        self.server = self.servers[0]
        self.max_hops = max_hops
        self._client = httpx.AsyncClient(headers=_headers(token), timeout=timeout)
        self._lean = H1Pool(timeout=timeout) if lean else None
        self._auth = tuple(_headers(token).items())

    async def _send(self, method: str, server: str, path: str, *, content: bytes = b"",
                    params: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None) -> Answer:
        """One request to ``server``: an ``httpx.Response`` or a ``clients.h1.Response`` (the
        same attributes for what this module reads)."""
        if self._lean is None or not server.startswith("http://"):
            return await self._client.request(method, server + path, content=content, params=params,
                                              headers=headers)
        target = f"{path}?{urlencode(params)}" if params else path
        return await self._lean.request(server, method, target, (*self._auth, *(headers or {}).items()), content)

    async def _call(self, method: str, path: str, what: str, **kw: Any) -> Answer:
        """See ``HttpApi._call``."""
        for i, server in enumerate(self.servers):
            try:
                resp = await self._send(method, server, path, **kw)
            except _CONNECT_ERRORS as exc:
                if i + 1 < len(self.servers):
                    continue
                raise _unreachable(what, self.servers, exc) from None
            except _TRANSPORT_ERRORS as exc:
                raise _unreachable(what, (server,), exc) from None
            self.server = server
            return resp
        raise AssertionError("unreachable: parse_servers never returns an empty tuple")

    async def _routed(self, method: str, path: str, what: str, **kw: Any) -> tuple[Answer, str]:
        """See ``HttpApi._routed``."""
        resp = await self._call(method, path, what, **kw)
        route = DocumentRoute(self.server, self.max_hops)
        while hop := route.next(resp.status_code, _problem_body(resp)):
            await asyncio.sleep(hop.delay)
            try:
                resp = await self._send(method, hop.url, path, **kw)
            except _TRANSPORT_ERRORS as exc:
                raise _unreachable(f"{what} (sent on to {hop.url})", (hop.url,), exc) from None
        return resp, route.describe(what)

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self._call(method, path, f"{method} {path}", **kw)
        _raise_for(resp, f"{method} {path}")
        return resp.json()

    async def _doc_json(self, method: str, key: str, **kw: Any) -> Any:
        resp, what = await self._routed(method, doc_path(key), f"{method} {key!r}", **kw)
        _raise_for(resp, what)
        return resp.json()

    async def get(self, key: str) -> Document | None:
        resp, what = await self._routed("GET", doc_path(key), f"GET {key!r}")
        return _document(what, key, resp)

    async def put(self, key: str, value: bytes, *, cas: int | None = None,
                  durability: str | None = None) -> dict[str, Any]:
        return await self._doc_json("PUT", key, content=value, params=_write_params(durability),
                                    headers={"Content-Type": "application/octet-stream", **_cas_header(cas)})

    async def delete(self, key: str, *, cas: int | None = None, durability: str | None = None) -> dict[str, Any]:
        return await self._doc_json("DELETE", key, params=_write_params(durability), headers=_cas_header(cas))

    async def bulk(self, ops: Iterable[Mapping[str, Any]], *, durability: str | None = None,
                   ndjson: bool = False, columns: bool = False) -> dict[str, Any]:
        """``POST /docs/_bulk``; see ``HttpApi.bulk``.  A whole-request ``421`` or ``503
        partition-not-active`` (nothing applied) is followed as for one document."""
        body, headers = bulk_body(ops, ndjson=ndjson)
        return await self.bulk_bytes(body, headers["Content-Type"], durability=durability, columns=columns)

    async def bulk_bytes(self, body: bytes, content_type: str = "application/json", *,
                         durability: str | None = None, columns: bool = False) -> dict[str, Any]:
        """``bulk`` of a body the caller already encoded (``bulk_body``'s output, or the same
        items formatted by a writer that holds its values as JSON text already)."""
        resp, what = await self._routed("POST", BULK_PATH, "POST /docs/_bulk", content=body,
                                        params=_bulk_params(durability, columns),
                                        headers={"Content-Type": content_type})
        _raise_for(resp, what)
        return resp.json()

    async def partitions(self) -> list[dict[str, Any]]:
        return (await self._json("GET", "/partitions"))["partitions"]

    async def partition(self, partition: int) -> dict[str, Any]:
        """``GET /partitions/{id}``: one partition's state, high seqno and failover log."""
        return await self._json("GET", f"/partitions/{partition}")

    async def status(self) -> dict[str, Any]:
        return await self._json("GET", "/status")

    async def __aenter__(self) -> "AsyncHttpApi":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._lean is not None:
            await self._lean.aclose()
