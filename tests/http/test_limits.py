"""Size limits are enforced while the body streams in, before it is buffered whole."""
from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.support.server import ServerProcess, start_server
from tests.support.problems import problem

pytestmark = pytest.mark.slow

MAX_VALUE = 1000
MAX_BULK = 4000
MAX_ITEMS = 10


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(
        tmp_path_factory.mktemp("upr-limits"),
        args=["--max-value-bytes", str(MAX_VALUE), "--max-bulk-bytes", str(MAX_BULK),
              "--max-bulk-items", str(MAX_ITEMS), "--max-key-bytes", "20"],
    )
    yield srv
    srv.kill()


def raw_request(srv: ServerProcess, head: bytes, body_parts: list[bytes]) -> bytes:
    """Send the head and only the given body parts, then read the answer without finishing."""
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        for part in body_parts:
            sock.sendall(part)
        sock.shutdown(socket.SHUT_WR) if not body_parts else None
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_value_at_limit_ok_over_limit_413(small: ServerProcess) -> None:
    with httpx.Client(base_url=small.url) as c:
        assert c.put("/docs/fits", content=b"x" * MAX_VALUE).status_code == 200
        body = problem(c.put("/docs/big", content=b"x" * (MAX_VALUE + 1)), 413, "too-large")
        assert body["limit"] == MAX_VALUE
        assert c.get("/docs/big").status_code == 404


def test_declared_length_refused_before_the_body_is_sent(small: ServerProcess) -> None:
    # Claims 1 GB and sends nothing: the answer must come without waiting for the body.
    head = b"PUT /docs/huge HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"
    answer = raw_request(small, head, [b"x" * 100])
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"application/problem+json" in answer


def test_chunked_body_refused_once_over_the_limit(small: ServerProcess) -> None:
    # Chunked, never terminated: the server must answer once it has seen > limit bytes.
    head = b"PUT /docs/chunky HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = [b"200\r\n" + b"y" * 0x200 + b"\r\n"] * 3   # 1536 bytes > 1000
    answer = raw_request(small, head, chunks)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_bulk_limits(small: ServerProcess) -> None:
    with httpx.Client(base_url=small.url) as c:
        items = [{"op": "set", "key": f"i{i}", "value": i} for i in range(MAX_ITEMS + 1)]
        body = problem(c.post("/docs/_bulk", content=orjson.dumps(items)), 413, "too-large")
        assert body["limit"] == MAX_ITEMS
        ok = c.post("/docs/_bulk", content=orjson.dumps(items[:MAX_ITEMS]))
        assert ok.json()["succeeded"] == MAX_ITEMS
        big = [{"op": "set", "key": "big", "value": "z" * MAX_BULK}]
        problem(c.post("/docs/_bulk", content=orjson.dumps(big)), 413, "too-large")
        # a value over max_value_bytes inside an allowed body is that item's error
        over = [{"op": "set", "key": "v", "value_b64": "QUFB" * 400}, {"op": "set", "key": "ok", "value": 1}]
        res = c.post("/docs/_bulk", content=orjson.dumps(over)).json()["results"]
        assert [r["status"] for r in res] == [413, 200]
        long_key = c.put("/docs/" + "k" * 21, content=b"1")
        problem(long_key, 422, "invalid-key")


def test_backpressure_is_429_with_retry_after(upr_server) -> None:  # type: ignore[no-untyped-def]
    # A 60 s flush interval: only backpressure itself (which kicks the flusher) drains the queues.
    srv = upr_server(args=["--queue-memory-limit-mb", "1", "--flush-interval-ms", "60000"])
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        r = None
        for i in range(40):   # 40 x 64 KiB = 2.5 MiB > 1 MiB
            r = c.put(f"/docs/bp-{i}", content=b"b" * 65536)
            if r.status_code != 200:
                break
        assert r is not None
        body = problem(r, 429, "backpressure")
        assert r.headers["retry-after"] == "1" and body["code"] == "backpressure"
        big = orjson.dumps([{"op": "set", "key": f"bp-b{i}", "value": "v" * 65536} for i in range(20)])
        for _ in range(10):   # a batch that finds the queues past the limit is refused whole
            r = c.post("/docs/_bulk", content=big)
            if r.status_code != 200:
                break
        problem(r, 429, "backpressure")
        assert c.post("/admin/flush").status_code == 200
        assert c.put("/docs/bp-more", content=b"x").status_code == 200


def test_toml_config_file_and_env_reach_the_server(upr_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "upr.toml"
    cfg.write_text('[server]\nmax_value_bytes = 10\nmax_bulk_items = 2\n')
    srv = upr_server(args=["--config", str(cfg)], env={"UPR_MAX_BULK_ITEMS": "3"})
    with httpx.Client(base_url=srv.url) as c:
        assert c.put("/docs/ten", content=b"0123456789").status_code == 200
        problem(c.put("/docs/eleven", content=b"0123456789a"), 413, "too-large")
        three = [{"op": "set", "key": f"t{i}", "value": i} for i in range(3)]
        assert c.post("/docs/_bulk", content=orjson.dumps(three)).status_code == 200   # env beats the file
        problem(c.post("/docs/_bulk", content=orjson.dumps(three * 2)), 413, "too-large")
