"""A bulk's answer leaves uvicorn's HTTP/1.1 cycle in one transport write (head and body), and a
``Connection: close`` answer is closed after it, not before."""
from __future__ import annotations

import asyncio
import logging

import pytest
from starlette.responses import Response
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.fast_bulk import _answer_in_one_write


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def close(self) -> None:
        self.calls.append(("close", b""))

    def is_closing(self) -> bool:
        return any(kind == "close" for kind, _ in self.calls)


def _cycle(transport: RecordingTransport, keep_alive: bool) -> RequestResponseCycle:
    scope = {"type": "http", "method": "POST", "path": "/docs/_bulk", "http_version": "1.1", "headers": []}
    log = logging.getLogger("test")
    return RequestResponseCycle(scope, transport, FlowControl(transport), log, log, False, [],  # type: ignore[arg-type]
                                asyncio.Event(), False, keep_alive, lambda: None)


@pytest.mark.parametrize("keep_alive", [True, False])
def test_the_head_and_body_go_out_in_one_write(keep_alive: bool) -> None:
    transport = RecordingTransport()
    cycle = _cycle(transport, keep_alive)
    body = b'{"succeeded":2,"failed":0}'

    async def answer() -> None:
        await _answer_in_one_write(Response(body, 200, media_type="application/json"), cycle.scope,
                                   cycle.receive, cycle.send)

    asyncio.run(answer())
    writes = [data for kind, data in transport.calls if kind == "write"]
    assert len(writes) == 1
    head, _, sent = writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and sent == body
    assert cycle.transport is transport and cycle.response_complete
    assert [kind for kind, _ in transport.calls] == (["write"] if keep_alive else ["write", "close"])


def test_another_servers_send_is_called_as_it_is() -> None:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    asyncio.run(_answer_in_one_write(Response(b"{}", 200), {"type": "http"}, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
