"""A tiny raw stream client for the end-to-end tests: real ``websockets``, the protocol's own
message and frame codecs, no client library (that one is tested on its own).

``Mirror`` applies what a consumer receives to a plain dict and tracks the per-partition position
exactly as a DCP consumer must (uuid, seqno, snapshot range), so a test can compare it with the
server's contents and resume from it.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from engine.protocol import frames as F
from engine.protocol import messages as M
from engine.protocol.bundle import decode_bundle, is_bundle
from engine.protocol.packed import decode_packed, is_packed

__all__ = ["Position", "Mirror", "RawStream", "write_docs", "ws_url"]


def ws_url(http_url: str, token: str | None = None) -> str:
    url = http_url.replace("http://", "ws://", 1) + "/stream"
    return url + (f"?access_token={token}" if token else "")


@dataclass
class Position:
    uuid: int = 0
    seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0

    def request(self, partition: int, **extra: Any) -> dict[str, Any]:
        return {"type": "stream_request", "partition": partition, "uuid": self.uuid, "start_seqno": self.seqno,
                "snap_start": self.snap_start, "snap_end": self.snap_end, **extra}


@dataclass
class Mirror:
    """A consumer's copy of the data plus its positions (only ever advanced by processed items)."""

    docs: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # live key -> (seqno, value)
    positions: dict[int, Position] = field(default_factory=dict)
    items_seen: int = 0
    #: (partition, seqno) of every item received, for ordering / duplicate checks
    log: list[tuple[int, int, str, bool]] = field(default_factory=list)
    _pending: dict[int, tuple[int, int]] = field(default_factory=dict)  # marker not yet promoted

    def on_response(self, msg: dict[str, Any]) -> None:
        if msg["status"] == "ok" and msg.get("failover_log"):
            pos = self.positions.setdefault(msg["partition"], Position())
            pos.uuid = msg["failover_log"][0][0]

    def on_marker(self, msg: dict[str, Any]) -> None:
        self._pending[msg["partition"]] = (msg["start"], msg["end"])

    def on_batch(self, batch: F.ItemBatch) -> None:
        p = batch.partition
        pos = self.positions.setdefault(p, Position())
        if p in self._pending:
            pos.snap_start, pos.snap_end = self._pending.pop(p)
        for key, seqno, _cas, _rev, deleted, value in batch.rows():
            k = key.decode()
            if deleted:
                self.docs.pop(k, None)
            else:
                self.docs[k] = (seqno, value)
            pos.seqno = seqno
            self.log.append((p, seqno, k, bool(deleted)))
        self.items_seen += len(batch)
        if batch.last:
            pos.seqno = pos.snap_end

    def rollback(self, partition: int, seqno: int, server_docs: dict[str, bytes]) -> None:
        """Undo everything above ``seqno``: here, by re-reading those keys' current state."""
        pos = self.positions.setdefault(partition, Position())
        pos.seqno = pos.snap_start = pos.snap_end = seqno
        self._pending.pop(partition, None)


class RawStream:
    """One WebSocket stream connection speaking the protocol by hand."""

    def __init__(self, ws: ClientConnection, auto_ack: bool = True) -> None:
        self.ws = ws
        self.auto_ack = auto_ack
        self.unacked = 0
        self.failover: dict[str, Any] = {}
        self.window = 0
        self.early: list[Any] = []
        self.parts: list[Any] = []  # the rest of the bundle (or packed pass) being read
        self.bundles = 0  # bundle messages received
        self.packed = 0  # packed passes received (hello frames: packed)

    @classmethod
    async def open(cls, http_url: str, *, name: str = "test", partitions: Iterable[int] | None = None,
                   codec: str = "binary", window: int | None = None, token: str | None = None,
                   auto_ack: bool = True, max_queue: int | None = 16, bundle: bool = False,
                   frames: str = "messages") -> "RawStream":
        ws = await connect(ws_url(http_url, token), compression=None, max_size=None, open_timeout=10,
                           max_queue=max_queue)
        self = cls(ws, auto_ack)
        self.window = window or 0
        await self.send({"type": "hello", "name": name, "codec": codec, "window_bytes": window,
                         "partitions": None if partitions is None else list(partitions), "protocol": 1,
                         "bundle": bundle, "frames": frames})
        msg = await self.recv()
        assert isinstance(msg, dict) and msg["type"] == "failover_logs", msg
        self.failover = msg
        return self

    async def send(self, obj: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(obj))

    async def recv(self, timeout: float = 30.0) -> dict[str, Any] | F.ItemBatch:
        """The next message (a bundle's parts one by one; its whole size counts when it arrives)."""
        if self.parts:
            data = self.parts.pop(0)
        else:
            data = await asyncio.wait_for(self.ws.recv(), timeout)
            size = len(data) if isinstance(data, bytes) else len(data.encode())
            self.unacked += size
            if isinstance(data, bytes) and is_bundle(data):
                self.bundles += 1
                self.parts = list(decode_bundle(data))
                data = self.parts.pop(0)
        if isinstance(data, bytes) and is_packed(data):
            self.packed += 1
            self.parts[:0] = [json.loads(M.encode(m)) if isinstance(m, M.SnapshotMarker) else m
                              for m in decode_packed(data).messages()]
            data = self.parts.pop(0)
        if not isinstance(data, (str, bytes)):  # a packed pass's message, decoded
            out: dict[str, Any] | F.ItemBatch = data
        elif isinstance(data, bytes):
            out = F.decode_binary(data)
        else:
            obj = json.loads(data)
            out = F.json_obj_to_batch(obj) if obj.get("type") == "items" else obj
        if self.auto_ack and self.unacked >= min(64 * 1024, (self.window or 1 << 30) // 2):
            await self.ack()
        return out

    async def ack(self) -> None:
        if self.unacked:
            n, self.unacked = self.unacked, 0
            await self.send({"type": "ack", "bytes": n})

    async def close(self) -> None:
        await self.ws.close()

    async def stream(self, partitions: Iterable[int], mirror: Mirror | None = None,
                     **extra: Any) -> dict[int, dict[str, Any]]:
        """Send stream requests from ``mirror``'s positions; collect the responses (messages that
        race ahead are kept for ``consume``)."""
        positions = mirror.positions if mirror is not None else {}
        wanted = list(partitions)
        for p in wanted:
            await self.send(positions.get(p, Position()).request(p, **extra))
        responses = await self.responses(len(wanted))
        if mirror is not None:
            for r in responses.values():
                mirror.on_response(r)
        return responses

    async def responses(self, n: int) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        while len(out) < n:
            msg = await self.recv()
            if isinstance(msg, dict) and msg["type"] == "stream_response":
                out[msg["partition"]] = msg
            else:
                self.early.append(msg)
        return out

    async def consume(self, mirror: Mirror, *, until: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Feed messages to ``mirror`` until ``until(msg)`` is true; returns control messages seen."""
        controls: list[dict[str, Any]] = []
        backlog = self.early  # messages that raced ahead of stream responses come first
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if backlog:
                msg = backlog.pop(0)
            else:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise TimeoutError(f"condition not met in {timeout}s; last controls {controls[-5:]}")
                msg = await self.recv(timeout=left)
            if isinstance(msg, F.ItemBatch):
                mirror.on_batch(msg)
            else:
                controls.append(msg)
                if msg["type"] == "snapshot":
                    mirror.on_marker(msg)
                elif msg["type"] == "stream_response":
                    mirror.on_response(msg)
            if until(msg):
                return controls


def write_docs(http_url: str, docs: dict[str, bytes | None], headers: dict[str, str] | None = None,
               durability: str = "memory") -> list[dict[str, Any]]:
    """Write (value) or delete (None) documents through ``POST /docs/_bulk``; returns item results."""
    import base64

    items = [
        {"op": "delete", "key": k} if v is None else {"op": "set", "key": k, "value_b64": base64.b64encode(v).decode()}
        for k, v in docs.items()
    ]
    results: list[dict[str, Any]] = []
    for i in range(0, len(items), 5000):
        r = httpx.post(f"{http_url}/docs/_bulk?durability={durability}", json=items[i:i + 5000],
                       headers=headers or {}, timeout=60)
        r.raise_for_status()
        results += r.json()["results"]
    return results
