"""Status, partitions, streams, metrics and admin endpoints against a real server."""
from __future__ import annotations

import httpx
import pytest

from tests.support.keys import PARTITIONS, key_in
from tests.support.problems import problem

pytestmark = pytest.mark.slow


def test_status_totals(client: httpx.Client) -> None:
    before = client.get("/status").json()
    client.put("/docs/status-1", content=b"a")
    client.put("/docs/status-2?durability=persist", content=b"b")
    after = client.get("/status").json()
    assert after["partitions"] == PARTITIONS and len(after["node_id"]) >= 8
    assert after["uptime_s"] >= before["uptime_s"]
    assert after["totals"]["items"] == before["totals"]["items"] + 2
    assert after["totals"]["high_seqno"] == before["totals"]["high_seqno"] + 2
    assert after["totals"]["streams_connected"] == 0
    assert after["engine"]["writes_total"] >= 2


def test_partitions_listing(client: httpx.Client) -> None:
    parts = client.get("/partitions").json()["partitions"]
    assert [p["partition"] for p in parts] == list(range(PARTITIONS))
    one = client.get("/partitions/3").json()
    assert one["state"] == "active" and one["failover_log"][0]["uuid"] == one["uuid"]
    assert {"high_seqno", "persisted_seqno", "purge_seqno", "item_count", "queue_depth"} <= set(one)
    body = problem(client.get(f"/partitions/{PARTITIONS}"), 404, "unknown-partition")
    assert body["partition"] == PARTITIONS


def test_partition_not_active_then_failover(client: httpx.Client) -> None:
    key = key_in(6, "state")
    log_before = client.get("/partitions/6").json()["failover_log"]
    r = client.post("/admin/partitions/6/state", json={"state": "replica"})
    assert r.status_code == 200 and r.json()["state"] == "replica"
    body = problem(client.put(f"/docs/{key}", content=b"x"), 503, "partition-not-active")
    assert body["partition"] == 6
    bulk = client.post("/docs/_bulk", json=[{"op": "set", "key": key, "value": 1},
                                            {"op": "set", "key": key_in(1, "state"), "value": 1}]).json()
    assert [x["status"] for x in bulk["results"]] == [503, 200]
    assert bulk["results"][0]["error"]["partition"] == 6
    back = client.post("/admin/partitions/6/state", json={"state": "active"}).json()
    assert back["state"] == "active" and len(back["failover_log"]) == len(log_before) + 1
    assert client.put(f"/docs/{key}", content=b"x").status_code == 200
    problem(client.post("/admin/partitions/6/state", json={"state": "sleepy"}), 422, "invalid-input")
    problem(client.post(f"/admin/partitions/{PARTITIONS}/state", json={"state": "dead"}), 404, "unknown-partition")


def test_flush_and_compact(client: httpx.Client) -> None:
    key = key_in(4, "tomb")
    client.put(f"/docs/{key}", content=b"x")
    deleted = client.delete(f"/docs/{key}").json()
    flushed = client.post("/admin/flush").json()
    assert flushed["flushed"] is True and flushed["persisted_seqnos"]["4"] >= deleted["seqno"]
    r = client.post("/admin/compact", json={"purge_before_seqno": {"4": deleted["seqno"] + 1}})
    assert r.status_code == 200
    assert r.json()["purge_seqnos"]["4"] == deleted["seqno"]
    assert client.get("/partitions/4").json()["purge_seqno"] == deleted["seqno"]
    problem(client.post("/admin/compact", json={}), 422, "invalid-input")
    problem(client.post("/admin/compact", json={"purge_before_seqno": {"99": 1}}), 404, "unknown-partition")
    problem(client.post("/admin/compact", json={"older_than_s": -1}), 422, "invalid-input")


def test_streams_empty_and_metrics(client: httpx.Client) -> None:
    assert client.get("/streams").json() == {"streams": []}
    client.put("/docs/metric", content=b"x")
    text = client.get("/metrics").text
    for name in ("upr_http_requests_total", "upr_http_request_duration_seconds_bucket", "upr_partition_high_seqno",
                 "upr_partition_queue_depth", "upr_engine_flush_count", "upr_streams_connected", "upr_stream_rollbacks"):
        assert name in text, name
    assert 'route="/docs/{key:doc_key}"' in text  # templates, not raw paths


def test_ready_and_health(client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json()["ready"] is True
