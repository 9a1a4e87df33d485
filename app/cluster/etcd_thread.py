"""One etcd connection on a thread of its own, for the transaction that ends a handover's pause.

Why a thread: the node's etcd client (``app.cluster.etcd``) runs on the node's event loop, and a
request there passes the loop five or six times (pool, write, headers, body, the caller's
resumption).  A handover's source is the busiest node of a rebalance (its copy streams, the
writes of every partition it still owns), and each of those passes waits for whatever callback
runs at the time: the switch transaction, the one step of the write pause left once the target
has caught up, took several times etcd's own answer time there (docs/benchmarks.md, Cluster:
"The switch transaction off the event loop").  A blocking ``http.client`` connection on a
thread waits for nothing but the GIL, which a thread blocked on a socket gets back within the
interpreter's switch interval; the loop is visited once, to hand over the answer.

The semantics are ``EtcdClient``'s: endpoints in order, ``EtcdUnavailable`` when none answers,
``EtcdError`` for etcd's own errors.  A request is sent at most once (``_post``).
"""
from __future__ import annotations

import asyncio
import http.client
import json
import queue
import select
import socket
import threading
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

from app.cluster.etcd import Compare, EtcdClient, EtcdUnavailable, TxnOp, TxnResult, checked, txn_body, txn_result

__all__ = ["EtcdThread"]


class _Marks(Protocol):
    connected_new: bool

    def mark(self, name: str) -> None: ...


class EtcdThread:
    """Transactions sent from a dedicated thread over one keep-alive connection; the thread
    starts with the first transaction and ends with ``close``."""

    def __init__(self, client: EtcdClient, *, timeout: float = 5.0) -> None:
        self._client = client
        self._timeout = timeout
        self._jobs: queue.SimpleQueue[_Job | object | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: http.client.HTTPConnection | None = None
        #: the endpoint ``_conn`` goes to: the last that answered is tried first
        self._at = 0

    async def txn(self, compare: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = (), *,
                  marks: _Marks | None = None) -> TxnResult:
        """``EtcdClient.txn`` on this connection.  Cancelling the caller does not call the
        transaction back: it may commit all the same, as with any request already sent."""
        body = json.dumps(txn_body(compare, success, failure), separators=(",", ":")).encode()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._client.requests += 1
        self._start()
        self._jobs.put(_Job("/v3/kv/txn", body, loop, future, marks))
        return txn_result(await future)

    def warm(self) -> None:
        """Start the thread and open the connection now, ahead of the first transaction (a
        fence's catch-up comes before its pause).  Errors wait for the transaction."""
        self._start()
        self._jobs.put(_WARM)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="etcd switch", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """End the thread once the transactions queued are sent (it closes the connection)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                if self._conn is not None:
                    self._conn.close()
                return
            if job is _WARM:
                try:
                    self._connection(self._at)
                except OSError:
                    pass  # the transaction tries every endpoint and says why none answered
                continue
            assert isinstance(job, _Job)
            try:
                outcome: tuple[bool, Any] = (True, checked(self._post(job), job.path))
            except Exception as exc:  # noqa: BLE001 - handed to the caller, raised there
                outcome = (False, exc)
            try:
                job.loop.call_soon_threadsafe(_settle, job.future, outcome)
            except RuntimeError:
                pass  # the loop closed: nobody waits for the answer

    def _post(self, job: _Job) -> dict[str, Any]:
        """One request.  WHY no second try once the request may have left: a transaction etcd
        committed and whose answer was lost would be refused on a replay (its compares no longer
        hold), and the caller would take its own switch for someone else's.  Only a connection
        that could not be opened moves on to the next endpoint."""
        endpoints = self._client.endpoints
        last: Exception | None = None
        for i in range(len(endpoints)):
            at = (self._at + i) % len(endpoints)
            kept = self._conn
            try:
                conn = self._connection(at)
            except OSError as exc:
                last = exc
                continue
            if job.marks is not None and conn is not kept:
                job.marks.connected_new = True
            try:
                if job.marks is not None:
                    job.marks.mark("acquired")
                conn.request("POST", job.path, body=job.body, headers={"Content-Type": "application/json"})
                if job.marks is not None:
                    job.marks.mark("sent")
                response = conn.getresponse()
                if job.marks is not None:
                    job.marks.mark("answered")
                data = response.read()
                if job.marks is not None:
                    job.marks.mark("read")
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._conn = None
                raise EtcdUnavailable(f"etcd at {endpoints[at]} did not answer {job.path}: {exc!r}") from exc
            return json.loads(data)
        raise EtcdUnavailable(f"no etcd endpoint answered ({', '.join(endpoints)}): {last}")

    def _connection(self, at: int) -> http.client.HTTPConnection:
        """The open connection to endpoint ``at``, or a new one, connected.  A kept connection
        the server has closed (readable while no request is out: its end of file) is replaced
        before anything is sent on it."""
        conn = self._conn
        if conn is not None and self._at == at and conn.sock is not None:
            readable, _, _ = select.select([conn.sock], [], [], 0)
            if not readable:
                return conn
        if conn is not None:
            conn.close()
            self._conn = None
        url = urlsplit(self._client.endpoints[at])
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=self._timeout)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn, self._at = conn, at
        return conn


class _Job:
    __slots__ = ("path", "body", "loop", "future", "marks")

    def __init__(self, path: str, body: bytes, loop: asyncio.AbstractEventLoop,
                 future: asyncio.Future[dict[str, Any]], marks: _Marks | None) -> None:
        self.path, self.body, self.loop, self.future, self.marks = path, body, loop, future, marks


#: the job that only opens the connection (``warm``)
_WARM = object()


def _settle(future: asyncio.Future[dict[str, Any]], outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
