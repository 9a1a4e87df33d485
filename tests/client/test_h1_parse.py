"""``clients.h1``: a request's bytes, and responses parsed from bytes fed in pieces cut anywhere."""
from __future__ import annotations

import pytest

from clients.h1 import MAX_HEAD_BYTES, ProtocolError, ResponseParser, format_request


def test_a_request_is_its_line_host_length_headers_and_body() -> None:
    data = format_request("POST", "/docs/_bulk?durability=memory", "127.0.0.1:8000",
                          [("Authorization", "Bearer t"), ("Content-Type", "application/json")], b"[1]")
    assert data == (b"POST /docs/_bulk?durability=memory HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 3\r\n"
                    b"Authorization: Bearer t\r\nContent-Type: application/json\r\n\r\n[1]")


@pytest.mark.parametrize(("target", "headers"), [
    ("/a", [("X", "a\r\nInjected: 1")]),
    ("/a", [("X\r\nY", "1")]),
    ("/a", [("X:Y", "1")]),
    ("/a b", []),
    ("/a\r\n", []),
])
def test_a_line_break_in_a_header_or_target_is_refused(target: str, headers: list[tuple[str, str]]) -> None:
    with pytest.raises(ValueError):
        format_request("GET", target, "h", headers, b"")


LENGTH = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"ok\": true} "
CHUNKED = (b"HTTP/1.1 421 Misdirected Request\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
           b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n")
NO_CONTENT = b"HTTP/1.1 204 No Content\r\nContent-Length: 99\r\n\r\n"
INTERIM = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
CLOSING = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
OLD = b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx"


@pytest.mark.parametrize(("data", "status", "body", "keep_alive", "headers"), [
    (LENGTH, 200, b'{"ok": true} ', True, {"content-type": "application/json"}),
    (CHUNKED, 421, b"hello world", True, {"x-a": "1, 2"}),
    (NO_CONTENT, 204, b"", True, {}),
    (INTERIM, 200, b"hi", True, {}),
    (CLOSING, 503, b"", False, {}),
    (OLD, 200, b"x", False, {}),
])
def test_an_answer_cut_anywhere_parses_the_same(data: bytes, status: int, body: bytes, keep_alive: bool,
                                                 headers: dict[str, str]) -> None:
    for cut in range(len(data) + 1):
        for cut2 in (cut, min(len(data), cut + 3)):
            parser = ResponseParser()
            answers = parser.feed(data[:cut]) + parser.feed(data[cut:cut2]) + parser.feed(data[cut2:])
            assert len(answers) == 1, (cut, cut2)
            (answer,) = answers
            assert (answer.status_code, answer.content, answer.keep_alive) == (status, body, keep_alive)
            assert headers.items() <= answer.headers.items()
            assert parser.idle and parser.eof() is None


def test_answers_in_a_row_and_json() -> None:
    parser = ResponseParser()
    first, second = parser.feed(LENGTH + CHUNKED)
    assert first.json() == {"ok": True} and first.reason_phrase == "OK"
    assert second.text == "hello world" and second.reason_phrase == "Misdirected Request"
    with pytest.raises(ValueError):
        second.json()


def test_a_head_answer_has_no_body_and_an_unframed_one_runs_to_eof() -> None:
    parser = ResponseParser()
    parser.head_request = True
    (answer,) = parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
    assert answer.content == b""
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\n\r\nabc") == []
    assert parser.feed(b"def") == []
    answer = parser.eof()
    assert answer is not None and answer.content == b"abcdef" and not answer.keep_alive


@pytest.mark.parametrize("data", [
    b"HTTP/2 200 OK\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"SSH-2.0-OpenSSH\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
])
def test_what_is_not_http_1_1_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        ResponseParser().feed(data)


def test_a_head_without_end_and_a_cut_body_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        ResponseParser().feed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD_BYTES)
    parser = ResponseParser()
    parser.feed(LENGTH[:-3])
    with pytest.raises(ProtocolError):
        parser.eof()
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(ProtocolError):
        parser.eof()
