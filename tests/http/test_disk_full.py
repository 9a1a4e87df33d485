"""A real server whose data dir sits on a small tmpfs that fills up, then gets space back.

What a user sees: a persist write is answered 507 with the outcome (applied, queued, not
persisted, partition and seqno), ``/ready`` is 503 with the reason and ``/metrics`` shows the
fault, memory writes are refused with 429 once the unpersisted backlog passes
``--flush-failure-backlog-bytes``; once space returns the server persists everything by itself,
and every acknowledged write is there after a restart.  A stop that could not flush says what it
lost and exits non-zero instead of "engine closed cleanly".
"""
from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.keys import key_in
from tests.support.server import ServerProcess
from tests.support.small_fs import fill, small_tmpfs

PARTITIONS = 4
BIG = 200 << 10
BACKLOG = 1 << 20
PROBLEM = "application/problem+json"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "fs", 16) as where:
        yield where


def start(upr_server: Callable[..., ServerProcess], small_disk: Path, *args: str) -> ServerProcess:
    return upr_server(data_dir=small_disk / "data", partitions=PARTITIONS,
                      args=["--flush-failure-backlog-bytes", str(BACKLOG), *args])


def value(i: int, size: int = BIG) -> bytes:
    return bytes([65 + i % 26]) * size


def wait_ready(client: httpx.Client, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get("/ready").status_code != 200:
        assert time.monotonic() < deadline, client.get("/ready").text
        time.sleep(0.05)


def test_full_disk_answers_507_goes_unready_refuses_backlog_and_recovers_losslessly(
        upr_server, small_disk: Path) -> None:
    srv = start(upr_server, small_disk)
    acknowledged: dict[str, bytes] = {}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.put("/docs/before", content=b"b", params={"durability": "persist"}).status_code == 200
        acknowledged["before"] = b"b"
        filler = fill(small_disk)

        # persist write: 507 with the outcome, and the write is applied
        key = key_in(2, "big", PARTITIONS)
        r = c.put(f"/docs/{key}", content=value(0), params={"durability": "persist"})
        assert r.status_code == 507, r.text
        assert r.headers["content-type"] == PROBLEM
        body = r.json()
        assert body["type"] == "https://upr.dev/problems/insufficient-storage"
        assert body["code"] == "insufficient_storage"
        assert (body["applied"], body["persisted"], body["partition"]) == (True, False, 2)
        assert body["unpersisted"] == [{"partition": 2, "seqno": body["seqno"]}]
        assert "not persisted" in body["detail"] and "once space returns" in body["detail"]
        acknowledged[key] = value(0)  # applied: it must survive too
        got = c.get(f"/docs/{key}")
        assert got.status_code == 200 and got.content == value(0)
        assert got.headers["x-upr-seqno"] == str(body["seqno"])

        # bulk persist: the same answer, naming every partition it waited on
        bulk = c.post("/docs/_bulk", params={"durability": "persist"},
                      json=[{"op": "set", "key": key_in(1, "bulk", PARTITIONS), "value": "x"}])
        assert bulk.status_code == 507, bulk.text
        assert [u["partition"] for u in bulk.json()["unpersisted"]] == [1]
        acknowledged[key_in(1, "bulk", PARTITIONS)] = b'"x"'
        flush = c.post("/admin/flush")
        assert flush.status_code == 507 and flush.json()["code"] == "insufficient_storage", flush.text

        # not ready, with the reason; the metric says so
        ready = c.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["flush_failing"] is True and ready.json()["engine_open"] is True
        assert "full" in ready.json()["reason"]
        metrics = c.get("/metrics").text
        assert "upr_engine_flush_failing 1.0" in metrics

        # memory writes: taken up to the backlog bound, then refused with backpressure
        refused = None
        for i in range(1, 40):
            w = c.put(f"/docs/mem{i}", content=value(i))
            if w.status_code != 200:
                refused = w
                break
            acknowledged[f"mem{i}"] = value(i)
        assert refused is not None, "memory writes were never refused on a full disk"
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["code"] == "backpressure" and "flushing to disk is failing" in refused.json()["detail"]

        # space returns: ready again on its own, everything persisted, writes work
        filler.unlink()
        wait_ready(c)
        assert c.get("/ready").json() == {"ready": True, "engine_open": True, "flusher_running": True}
        assert "upr_engine_flush_failing 0.0" in c.get("/metrics").text
        for p in c.get("/partitions").json()["partitions"]:
            assert p["persisted_seqno"] == p["high_seqno"], p
        assert c.put("/docs/after", content=b"a", params={"durability": "persist"}).status_code == 200
        acknowledged["after"] = b"a"

    assert srv.stop() in (0, -signal.SIGTERM)  # uvicorn ends a clean stop by re-raising SIGTERM
    log = srv.log()
    assert log.count("flushing to disk is failing") == 1, log  # once, not once per retry
    assert log.count("flushing to disk recovered") == 1, log
    assert "Traceback" not in log, log

    again = start(upr_server, small_disk)
    with httpx.Client(base_url=again.url, timeout=30) as c:
        for key, expected in acknowledged.items():
            got = c.get(f"/docs/{key}")
            assert got.status_code == 200 and got.content == expected, key


def test_stop_while_the_disk_is_full_says_what_is_lost_and_exits_non_zero(upr_server, small_disk: Path) -> None:
    srv = start(upr_server, small_disk, "--log-level", "info")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.put("/docs/kept", content=b"k", params={"durability": "persist"}).status_code == 200
        fill(small_disk)
        key = key_in(3, "lost", PARTITIONS)
        assert c.put(f"/docs/{key}", content=value(1)).status_code == 200
        deadline = time.monotonic() + 30
        while c.get("/ready").status_code != 503:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert srv.stop() == 3
    log = srv.log()
    assert "engine closed cleanly" not in log, log
    assert "unpersisted writes, which are lost" in log and "partition 3 seqnos 1..1 (1 item(s))" in log, log
