"""HTTP/1.1 on the wire, sans I/O: a request's bytes and a response parsed from fed bytes.

WHY our own and not httpx for the client's hot write path: a small bulk's client CPU through
``httpx.AsyncClient`` (URL model, header model, event hooks, the connection pool's state
machine, h11's event objects) is larger than the server's own work on the request
(docs/benchmarks.md, Peers, "a small write's request").  The server is ours and answers plainly
(``Content-Length`` or chunked bodies, keep-alive), so a client needs only: one request line and
headers formatted in one pass, and a parser for a status line, headers and a body.  Anything
this parser does not understand is a ``ProtocolError`` (the caller drops the connection), never
a guess.

Pure: no sockets (``clients.h1_pool`` moves the bytes), so the parser is tested by feeding it
bytes cut at every position.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["MAX_HEAD_BYTES", "ProtocolError", "Response", "ResponseParser", "format_request"]

#: a status line and headers longer than this are not an answer from our server
MAX_HEAD_BYTES = 64 << 10


class ProtocolError(Exception):
    """The peer sent something that is not an HTTP/1.1 response this client can read."""


@dataclass
class Response:
    """One answer: what ``clients.http`` reads from an ``httpx.Response`` (status, reason, headers
    with lower-case names, body, ``json()``), so its error mapping serves both."""

    status_code: int
    reason_phrase: str
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes = b""
    keep_alive: bool = True

    def json(self) -> Any:
        return orjson.loads(self.content)  # a JSONDecodeError is a ValueError, as httpx's

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def format_request(method: str, target: str, host: str, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    """The request's bytes: request line, ``Host``, ``Content-Length``, the caller's headers, body.

    ``target`` is the path and query, already percent-encoded; header values must not contain
    CR or LF (a ``ValueError``: a header split in two would be a request smuggled in)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} has a line break or a colon in its name")
        lines.append(f"{name}: {value}")
    if any(c in target for c in " \r\n"):
        raise ValueError(f"request target {target!r} has a space or a line break")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ResponseParser:
    """Feed bytes with ``feed``; it returns each complete ``Response`` (in order) as it ends.

    Bodies: ``Content-Length``, ``Transfer-Encoding: chunked``, or none for 1xx, 204 and 304
    and for answers to ``HEAD``.  An answer with neither length nor chunking is read until the
    connection ends (``eof``).  1xx interim answers are skipped."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._head: Response | None = None
        self._length = -1  # body bytes still expected; -1 chunked; -2 until EOF
        self._body = bytearray()
        self._chunk = 0  # in a chunked body: bytes left of the current chunk
        self._chunk_state = "size"  # size | data | data_end | trailers
        self.head_request = False  # the request in flight was HEAD: no body follows its answer

    def feed(self, data: bytes) -> list[Response]:
        self._buf += data
        out: list[Response] = []
        while True:
            if self._head is None:
                if not self._parse_head():
                    return out
            assert self._head is not None
            if not self._parse_body():
                return out
            out.append(self._finish())

    def eof(self) -> Response | None:
        """The connection ended: the answer read until EOF, if one was; raises if an answer was
        cut short."""
        if self._head is None:
            if self._buf:
                raise ProtocolError("the connection ended inside a response's head")
            return None
        if self._length == -2:
            self._body += self._buf
            self._buf.clear()
            return self._finish()
        raise ProtocolError("the connection ended inside a response's body")

    @property
    def idle(self) -> bool:
        """Nothing of a response has been received (the state between answers)."""
        return self._head is None and not self._buf

    def _parse_head(self) -> bool:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise ProtocolError(f"a response head longer than {MAX_HEAD_BYTES} bytes")
            return False
        head = bytes(buf[:end]).decode("latin-1")
        del buf[:end + 4]
        status_line, *header_lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise ProtocolError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise ProtocolError(f"a malformed header line: {line[:80]!r}")
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection if parts[0] == "HTTP/1.1" else "keep-alive" in connection
        response = Response(status, parts[2] if len(parts) > 2 else "", headers, b"", keep)
        if 100 <= status < 200:
            return self._parse_head()  # an interim answer: skipped, the real one follows
        self._head = response
        if self.head_request or status in (204, 304):
            self._length = 0
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._length, self._chunk_state = -1, "size"
        elif "content-length" in headers:
            text = headers["content-length"]
            if not text.isdigit():
                raise ProtocolError(f"a malformed Content-Length: {text!r}")
            self._length = int(text)
        else:
            self._length = -2
            response.keep_alive = False
        return True

    def _parse_body(self) -> bool:
        if self._length >= 0:
            if len(self._buf) < self._length:
                return False
            self._body += self._buf[:self._length]
            del self._buf[:self._length]
            return True
        if self._length == -2:
            return False
        return self._parse_chunks()

    def _parse_chunks(self) -> bool:
        buf = self._buf
        while True:
            state = self._chunk_state
            if state == "size":
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise ProtocolError("a chunk size line longer than 1024 bytes")
                    return False
                text = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[:end + 2]
                try:
                    self._chunk = int(text, 16)
                except ValueError:
                    raise ProtocolError(f"a malformed chunk size: {text[:40]!r}") from None
                self._chunk_state = "data" if self._chunk else "trailers"
            elif state == "data":
                take = min(self._chunk, len(buf))
                if not take:
                    return False
                self._body += buf[:take]
                del buf[:take]
                self._chunk -= take
                if self._chunk:
                    return False
                self._chunk_state = "data_end"
            elif state == "data_end":
                if len(buf) < 2:
                    return False
                if buf[:2] != b"\r\n":
                    raise ProtocolError("a chunk not followed by CRLF")
                del buf[:2]
                self._chunk_state = "size"
            else:  # trailers: lines until an empty one
                end = buf.find(b"\r\n")
                if end < 0:
                    return False
                del buf[:end + 2]
                if end == 0:
                    return True

    def _finish(self) -> Response:
        response = self._head
        assert response is not None
        response.content = bytes(self._body)
        self._head = None
        self._body.clear()
        self._length = 0
        return response
