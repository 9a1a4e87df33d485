"""GET /streams, /status and /metrics see live WebSocket stream connections (the registry hook)."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from websockets.asyncio.client import connect

from app.streams_registry import ConnectionStatus, PartitionStreamStatus, StreamRegistry

pytestmark = pytest.mark.slow


async def test_live_stream_is_listed(server) -> None:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        for i in range(3):
            await http.put(f"/docs/live-{i}", content=b"x")
        ws_url = server.url.replace("http://", "ws://") + "/stream"
        async with connect(ws_url) as ws:
            await ws.send(json.dumps({"type": "hello", "name": "lister", "partitions": None, "codec": "json",
                                      "window_bytes": None, "protocol": 1}))
            hello = json.loads(await ws.recv())
            assert hello["type"] == "failover_logs"
            uuid = hello["partitions"]["0"]["log"][0][0]
            await ws.send(json.dumps({"type": "stream_request", "partition": 0, "expected_state": "active",
                                      "uuid": uuid, "start_seqno": 0, "snap_start": 0, "snap_end": 0,
                                      "end_seqno": None, "to_now": False}))
            for _ in range(50):
                listed = (await http.get("/streams")).json()["streams"]
                if listed and listed[0]["partitions"]:
                    break
                await asyncio.sleep(0.05)
            assert len(listed) == 1
            s = listed[0]
            assert s["name"] == "lister" and s["codec"] == "json" and s["remote"].startswith("127.0.0.1")
            assert [p["partition"] for p in s["partitions"]] == [0]
            assert s["partitions"][0]["lag"] >= 0 and s["id"] >= 1
            assert (await http.get("/status")).json()["totals"]["streams_connected"] == 1
            assert "upr_streams_connected 1.0" in (await http.get("/metrics")).text
        for _ in range(50):
            if not (await http.get("/streams")).json()["streams"]:
                break
            await asyncio.sleep(0.05)
        assert (await http.get("/streams")).json() == {"streams": []}


class _Handle:
    def __init__(self, name: str) -> None:
        self.name = name
        self.stopped = False

    def to_status(self) -> ConnectionStatus:
        return ConnectionStatus(name=self.name, remote="r", codec="json",
                            partitions=[PartitionStreamStatus(partition=1, last_sent_seqno=5, lag=2)])

    async def shutdown(self) -> None:
        self.stopped = True


async def test_registry_ids_order_and_shutdown() -> None:
    reg = StreamRegistry()
    a, b = _Handle("a"), _Handle("b")
    assert (reg.register(a), reg.register(b)) == (1, 2)
    assert [(s.id, s.name) for s in reg.statuses()] == [(1, "a"), (2, "b")]
    assert all(s.connected_at > 0 for s in reg.statuses())
    reg.unregister(a)
    reg.unregister(a)  # idempotent
    assert len(reg) == 1 and [s.name for s in reg.statuses()] == ["b"]
    await reg.shutdown()
    assert b.stopped and not a.stopped
