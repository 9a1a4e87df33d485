"""The switch transaction's own etcd connection on a thread (``app.cluster.etcd_thread``): the
same answers as the loop's client against a real etcd; a kept connection the server closed is
replaced before a request goes out on it; a request that may have reached etcd is never sent
twice."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from app.cluster.etcd import Compare, EtcdClient, EtcdUnavailable, Get, Put
from app.cluster.etcd_thread import EtcdThread
from app.cluster.switch_trace import RequestStamps
from tests.cluster.etcd_server import EtcdProcess

_ANSWER = b'{"header":{"revision":"7"},"succeeded":true}'


async def test_a_guarded_transaction_commits_once_and_is_refused_with_the_reads_after(etcd: EtcdProcess) -> None:
    client = EtcdClient([etcd.url])
    channel = EtcdThread(client)
    try:
        rev = await client.put(b"/map", b"r1")
        stamps = RequestStamps()
        first = await channel.txn([Compare(b"/map", "mod", rev)], [Put(b"/map", b"r2")], [Get(b"/map")], marks=stamps)
        second = await channel.txn([Compare(b"/map", "mod", rev)], [Put(b"/map", b"r3")], [Get(b"/map")])
        assert first.succeeded and first.revision > rev
        assert not second.succeeded and second.reads[0][0].value == b"r2"
        assert second.reads[0][0].mod_revision == first.revision
        assert list(stamps.marks) == ["acquired", "sent", "answered", "read"]  # every step stamped, in order
        assert (await client.get(b"/map")).value == b"r2"  # type: ignore[union-attr]
        assert client.requests == 4  # counted with the client's own, for /metrics
    finally:
        channel.close()
        await client.aclose()


class _OneShotServer:
    """A listener whose connections each read one request, then answer it and close, or close
    without answering (``answer=False``)."""

    def __init__(self, *, answer: bool) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self.accepted = threading.Event()
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.set()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, body = data.split(b"\r\n\r\n", 1)
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests += 1
                if self.answer:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(_ANSWER)).encode() + b"\r\n\r\n" + _ANSWER)
            self.closed.set()

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture
def answering() -> Iterator[_OneShotServer]:
    server = _OneShotServer(answer=True)
    yield server
    server.stop()


@pytest.fixture
def silent() -> Iterator[_OneShotServer]:
    server = _OneShotServer(answer=False)
    yield server
    server.stop()


async def test_a_kept_connection_the_server_closed_is_replaced_before_the_next_request(
        answering: _OneShotServer) -> None:
    client = EtcdClient([answering.url])
    channel = EtcdThread(client)
    try:
        assert (await channel.txn([], [Put(b"/k", b"1")])).succeeded
        assert answering.closed.wait(5)  # the server ended that connection after its answer
        assert (await channel.txn([], [Put(b"/k", b"2")])).succeeded
        assert answering.requests == 2
    finally:
        channel.close()
        await client.aclose()


async def test_a_request_that_may_have_reached_etcd_is_not_sent_again(silent: _OneShotServer) -> None:
    # a second endpoint that would answer: a replay there could commit the transaction twice
    spare = _OneShotServer(answer=True)
    client = EtcdClient([silent.url, spare.url])
    channel = EtcdThread(client)
    try:
        with pytest.raises(EtcdUnavailable):
            await channel.txn([], [Put(b"/k", b"1")])
        assert (silent.requests, spare.requests) == (1, 0)
    finally:
        channel.close()
        spare.stop()
        await client.aclose()


async def test_an_endpoint_that_refuses_connections_gives_way_to_the_next() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    refusing = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    spare = _OneShotServer(answer=True)
    client = EtcdClient([refusing, spare.url])
    channel = EtcdThread(client)
    try:
        assert (await channel.txn([], [Put(b"/k", b"1")])).succeeded
        assert spare.requests == 1
    finally:
        channel.close()
        spare.stop()
        await client.aclose()


async def test_warming_opens_the_connection_the_first_transaction_then_uses(answering: _OneShotServer) -> None:
    client = EtcdClient([answering.url])
    channel = EtcdThread(client)
    try:
        channel.warm()
        assert answering.accepted.wait(5) and answering.requests == 0  # connected, nothing sent
        stamps = RequestStamps()
        assert (await channel.txn([], [Put(b"/k", b"1")], marks=stamps)).succeeded
        assert answering.requests == 1 and not stamps.connected_new  # on the warmed connection
    finally:
        channel.close()
        await client.aclose()
