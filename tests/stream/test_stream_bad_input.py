"""Bad input on a stream connection: an ``error`` naming the problem, then a clean close with a
code that says why (1008 protocol, 1003 unsupported data, 1009 too big); the server and other
consumers carry on."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from tests.support.server import ServerProcess, start_server
from tests.support.keys import PARTITIONS, key_in
from tests.support.stream import is_msg
from tests.support.wsclient import Mirror, RawStream, write_docs, ws_url

pytestmark = pytest.mark.slow

HELLO = json.dumps({"type": "hello", "name": "bad", "protocol": 1})
REQUEST = {"type": "stream_request", "partition": 0, "uuid": 0, "start_seqno": 0, "snap_start": 0, "snap_end": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("upr"), partitions=PARTITIONS)
    yield srv
    srv.kill()


async def refused(url: str, *frames: str | bytes) -> tuple[dict[str, Any], int, str]:
    """Send ``frames``; return the server's ``error`` message and its close code and reason."""
    async with websockets.connect(ws_url(url), compression=None, max_size=None) as ws:
        for frame in frames:
            await ws.send(frame)
        error = None
        try:
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if msg["type"] == "error":
                    error = msg
        except ConnectionClosed as closed:
            assert closed.rcvd is not None, "closed without a close frame"
            assert error is not None, "closed without an error message"
            return error, closed.rcvd.code, closed.rcvd.reason
    raise AssertionError("unreachable")


CASES = [
    ("malformed json", ["{not json"], "malformed_json", None, 1008),
    ("not an object", ["[1, 2]"], "not_an_object", None, 1008),
    ("unknown type", ['{"type": "subscribe"}'], "unknown_type", "type", 1008),
    ("request before hello", [json.dumps(REQUEST)], "wrong_order", "type", 1008),
    ("second hello", [HELLO, HELLO], "duplicate_hello", "type", 1008),
    ("hello partition out of range", [json.dumps({"type": "hello", "name": "x", "partitions": [3, 500]})],
     "invalid_partition", "partitions", 1008),
    ("wrong field type", ['{"type": "hello", "name": 5}'], "invalid_field", "name", 1008),
    ("unknown field", ['{"type": "hello", "name": "x", "nmae": "y"}'], "unknown_field", "nmae", 1008),
    ("name with a lone surrogate", ['{"type": "hello", "name": "x\\ud800"}'], "invalid_field", "name", 1008),
    ("cookie with a lone surrogate", [HELLO, '{"type": "barrier", "cookie": "\\udc00c"}'], "invalid_field", "cookie",
     1008),
    ("missing field", [HELLO, json.dumps({"type": "stream_request", "partition": 0})], "missing_field", "uuid", 1008),
    ("ack beyond in flight", [HELLO, '{"type": "ack", "bytes": 999999999}'], "ack_exceeds_in_flight", "bytes", 1008),
    ("binary frame", [HELLO, b"\x00\x01binary"], "unsupported_data", None, 1003),
    ("unsupported protocol", ['{"type": "hello", "name": "x", "protocol": 2}'], "unsupported_protocol", "protocol",
     1003),
    ("oversized message", [HELLO, json.dumps({"type": "barrier", "cookie": "x" * (2 << 20)})],
     "message_too_large", None, 1009),
]


@pytest.mark.parametrize("frames,code,field,close_code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_bad_input_gets_a_named_error_and_a_clean_close(
    server: ServerProcess, frames: list[str | bytes], code: str, field: str | None, close_code: int
) -> None:
    # another consumer is streaming the whole time and must not notice
    bystander = await RawStream.open(server.url, name="bystander")
    mirror = Mirror()
    await bystander.stream(range(PARTITIONS), mirror)

    error, closed_with, reason = await refused(server.url, *frames)
    assert error["code"] == code, error
    assert error["field"] == field, error
    assert error["message"]
    assert closed_with == close_code
    assert code in reason

    key = key_in(4, "bystander")
    write_docs(server.url, {key: b"unaffected"})
    await bystander.send({"type": "barrier", "cookie": "after"})
    await bystander.consume(mirror, until=is_msg("barrier", cookie="after"))
    assert mirror.docs[key][1] == b"unaffected"
    await bystander.close()
    assert httpx.get(f"{server.url}/health").status_code == 200


async def test_streams_listing_survives_a_name_that_is_not_unicode(server: ServerProcess) -> None:
    """A hello ``name`` holding a lone surrogate is refused at hello, so ``GET /streams`` (which
    lists every consumer's name) keeps answering while such a client tries to connect."""
    good = await RawStream.open(server.url, name="listed")
    async with websockets.connect(ws_url(server.url), compression=None) as ws:
        await ws.send('{"type": "hello", "name": "\\ud800", "protocol": 1}')
        listing = httpx.get(f"{server.url}/streams")
        msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (msg["type"], msg["code"], msg["field"]) == ("error", "invalid_field", "name"), msg
    assert listing.status_code == 200, listing.text
    assert "listed" in {s["name"] for s in listing.json()["streams"]}
    assert httpx.get(f"{server.url}/streams").status_code == 200
    await good.close()


async def next_error(stream: RawStream) -> dict[str, Any]:
    while True:
        msg = await stream.recv(timeout=10)
        if isinstance(msg, dict) and msg["type"] == "error":
            return msg


async def test_refused_request_keeps_the_connection(server: ServerProcess) -> None:
    """Per-stream refusals (partition out of range or not in hello, duplicate stream, closing a
    stream that is not open, duplicate cookie, range error) leave the connection and its other
    streams open."""
    stream = await RawStream.open(server.url, partitions=[0, 1], name="keeps", window=4096, auto_ack=False)
    await stream.stream([0])
    # A visit of partition 0 that stalls on the window (two ~64 KiB frames against 4 KiB, nothing
    # acknowledged) keeps the first "twice" cookie pending whatever the timing; without it the
    # server could return that cookie before reading the second one (a race seen under load).
    write_docs(server.url, {key_in(0, f"fill{i}"): b"x" * 1000 for i in range(100)})
    await stream.send({**REQUEST, "partition": 99})
    msg = await next_error(stream)
    assert (msg["code"], msg["field"], msg["partition"]) == ("invalid_partition", "partition", 99)
    await stream.send({**REQUEST, "partition": 5})
    msg = await next_error(stream)
    assert (msg["code"], msg["partition"]) == ("partition_not_requested", 5)
    await stream.send({"type": "close_stream", "partition": 1})
    msg = await next_error(stream)
    assert (msg["code"], msg["partition"]) == ("stream_not_open", 1)
    await stream.send({"type": "barrier", "cookie": "twice"})
    await stream.send({"type": "barrier", "cookie": "twice"})
    msg = await next_error(stream)
    assert (msg["code"], msg["field"]) == ("duplicate_cookie", "cookie")
    await stream.send(REQUEST)  # partition 0 again
    msg = await next_error(stream)
    assert msg["code"] == "duplicate_stream" and msg["partition"] == 0
    bad_range = {**REQUEST, "partition": 1, "start_seqno": 5, "snap_start": 6, "snap_end": 7}
    await stream.send(bad_range)
    responses = await stream.responses(1)
    assert responses[1]["status"] == "range_error" and responses[1]["field"] == "snap_start"
    stream.auto_ack = True
    await stream.ack()
    await stream.send({"type": "barrier", "cookie": "still-open"})
    await stream.consume(Mirror(), until=is_msg("barrier", cookie="still-open"))
    await stream.close()


async def test_frame_over_the_transport_limit_is_closed_with_1009(server: ServerProcess) -> None:
    """Past uvicorn's own 16 MiB frame limit the WebSocket layer closes with 1009 by itself."""
    async with websockets.connect(ws_url(server.url), compression=None, max_size=None) as ws:
        await ws.send(HELLO)
        await ws.recv()
        with pytest.raises(ConnectionClosed) as info:
            await ws.send("x" * (17 << 20))
            await ws.recv()
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    assert httpx.get(f"{server.url}/health").status_code == 200


async def test_a_client_flooding_requests_without_reading_is_held_back(server: ServerProcess) -> None:
    """Replies to a client that never reads are bounded: the server stops reading its requests
    (backpressure) instead of queueing replies without limit; it stays healthy meanwhile."""
    import psutil

    proc = psutil.Process(server.pid)
    before = proc.memory_info().rss
    async with websockets.connect(ws_url(server.url), compression=None, max_size=None, max_queue=1) as ws:
        await ws.send(HELLO)
        bad = json.dumps({"type": "close_stream", "partition": 0})  # each one earns an error reply
        # The kernel's socket buffers on loopback hold a few hundred thousand of these small
        # requests and replies, so a fixed count proves nothing; instead flood until one send
        # stalls for 2 s (the server stopped reading, its replies having filled every buffer).
        # Without backpressure no send ever stalls: a count far past what the buffers hold fails
        # the test (a count, not a time, because a loaded machine sends slower, not fewer).
        sent, stalled = 0, False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 240
        while not stalled and sent < 2_000_000 and loop.time() < deadline:
            try:
                async with asyncio.timeout(2):
                    for _ in range(1000):
                        await ws.send(bad)
                        sent += 1
            except TimeoutError:
                stalled = True
        assert stalled, f"sent {sent} requests and the server never stopped reading them"
        assert httpx.get(f"{server.url}/health").status_code == 200
        grown = proc.memory_info().rss - before
        assert grown < 64 * 2**20, f"server grew {grown / 2**20:.0f} MiB"
        ws.transport.abort()
