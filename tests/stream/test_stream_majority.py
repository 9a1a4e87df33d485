"""``visibility: majority`` through the hook a cluster node uses: a ceiling provider installed on
the ``StreamServer`` (``set_ceiling_provider``) and ``ceiling_advanced(p)`` calls when it moves.

The app runs in-process behind a real uvicorn on 127.0.0.1 (the provider is a Python callable, so
the server cannot be a subprocess); the "majority" is played by the test: it trails each
partition's high seqno by a few rounds of writes, as replicas' acknowledgements would.  Under
continuous writes (the local flusher persisting every 5 ms, ahead of that majority) the consumer
must keep up: never above the majority, and progressing while the writes go on, not only after.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from app.auth import TokenTable
from app.main import create_app
from app.settings import Settings
from engine.protocol import frames as F
from engine.protocol.messages import Visibility
from tests.stream.test_stream_visibility import open_stream
from tests.support.keys import PARTITIONS
from tests.support.stream import is_msg
from tests.support.wsclient import Mirror


@contextlib.asynccontextmanager
async def served(data_dir: Path, **settings_: Any) -> AsyncIterator[tuple[str, Any]]:
    """The app on a real socket in this event loop; yields its URL and the app."""
    settings = Settings.model_validate({"data_dir": data_dir, "partitions": PARTITIONS, **settings_})
    app = create_app(settings, tokens=TokenTable())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.ensure_future(server.serve())
    try:
        for _ in range(1000):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def test_a_majority_consumer_keeps_up_under_continuous_writes_and_never_passes_the_majority(
    tmp_path: Path,
) -> None:
    async with served(tmp_path / "data") as (url, app):
        engine = app.state.runner.engine
        streams = app.state.stream_server
        majority = {p: 0 for p in range(PARTITIONS)}
        streams.set_ceiling_provider(Visibility.MAJORITY, lambda p: majority[p])

        class Checked(Mirror):
            def on_batch(self, batch: F.ItemBatch) -> None:
                for seqno in batch.seqnos:  # the majority only grows: at receipt is an upper bound
                    assert seqno <= majority[batch.partition], (batch.partition, seqno, majority[batch.partition])
                super().on_batch(batch)

        mirror = Checked()
        stream = await open_stream(url, name="majority-reader", visibility="majority")
        assert {r["status"] for r in (await stream.stream(range(PARTITIONS), mirror)).values()} == {"ok"}

        writing = True
        rounds = 0
        written: set[str] = set()

        async def writer() -> None:
            nonlocal rounds
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                while writing:
                    batch = [{"op": "set", "key": f"k{(rounds * 7 + i) % 500}", "value": {"r": rounds}}
                             for i in range(20)]
                    r = await client.post("/docs/_bulk", json=batch)
                    assert r.status_code == 200
                    written.update(op["key"] for op in batch)
                    rounds += 1

        async def replicas() -> None:
            seen: list[dict[int, int]] = []
            while writing:
                seen.append({p: engine.high_seqno(p) for p in range(PARTITIONS)})
                if len(seen) > 3:  # the majority holds what was written three ticks ago
                    old = seen.pop(0)
                    for p in range(PARTITIONS):
                        if old[p] > majority[p]:
                            majority[p] = old[p]
                            streams.ceiling_advanced(p)
                await asyncio.sleep(0.01)

        tasks = [asyncio.ensure_future(writer()), asyncio.ensure_future(replicas())]
        received_while_writing = 0
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 3.0
            while loop.time() < deadline:
                try:
                    msg = await stream.recv(timeout=deadline - loop.time())
                except (TimeoutError, asyncio.TimeoutError):
                    break
                if isinstance(msg, F.ItemBatch):
                    mirror.on_batch(msg)
                    received_while_writing += len(msg)
                elif msg["type"] == "snapshot":
                    mirror.on_marker(msg)
        finally:
            writing = False
            await asyncio.gather(*tasks)
        assert rounds > 10
        assert received_while_writing > 0, "the majority consumer made no progress while writes went on"

        for p in range(PARTITIONS):  # the replicas catch up
            majority[p] = engine.high_seqno(p)
            streams.ceiling_advanced(p)
        await stream.send({"type": "barrier", "cookie": "caught-up"})
        got = await stream.consume(mirror, until=is_msg("barrier", cookie="caught-up"))
        assert {int(p): s for p, s in got[-1]["seqnos"].items()} == {p: engine.high_seqno(p) for p in range(PARTITIONS)}
        assert set(mirror.docs) == written  # every key, at its latest version's seqno
        for key, (seqno, _value) in mirror.docs.items():
            assert engine.get(key).seqno == seqno
        await stream.close()


@pytest.mark.parametrize("visibility", ["majority"])
async def test_without_a_provider_majority_streams_as_memory(tmp_path: Path, visibility: str) -> None:
    async with served(tmp_path / "data") as (url, app):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            r = await client.post("/docs/_bulk", json=[{"op": "set", "key": f"k{i}", "value": i} for i in range(40)])
            assert r.status_code == 200
        mirror = Mirror()
        stream = await open_stream(url, name="single-node", visibility=visibility)
        await stream.stream(range(PARTITIONS), mirror)
        await stream.send({"type": "barrier", "cookie": "all"})
        got = await stream.consume(mirror, until=is_msg("barrier", cookie="all"))
        engine = app.state.runner.engine
        assert {int(p): s for p, s in got[-1]["seqnos"].items()} == {p: engine.high_seqno(p) for p in range(PARTITIONS)}
        assert len(mirror.docs) == 40
        await stream.close()


async def test_readings_pinned_for_a_majority_that_does_not_come_are_released(tmp_path: Path) -> None:
    """Replicas gone: the pinned readings (a write-queue root, an LMDB read transaction) are let
    go after the stream drop limit, as a stalled consumer's would be, and nothing is sent."""
    async with served(tmp_path / "data", stream_drop_after_s=0.4) as (url, app):
        streams = app.state.stream_server
        streams.set_ceiling_provider(Visibility.MAJORITY, lambda p: 0)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            r = await client.post("/docs/_bulk", json=[{"op": "set", "key": f"k{i}", "value": i} for i in range(40)])
            assert r.status_code == 200
        stream = await open_stream(url, name="stuck", visibility="majority")
        await stream.stream(range(PARTITIONS), Mirror())
        (conn,) = list(streams.streams)

        async def pinned() -> int:
            return sum(1 for c in conn.cursors.values() if c.holding)

        for _ in range(500):
            if await pinned():
                break
            await asyncio.sleep(0.01)
        assert await pinned(), "no reading was pinned for the ceiling"
        for _ in range(500):
            if not await pinned():
                break
            await asyncio.sleep(0.01)
        assert not await pinned(), "pinned readings outlived the drop limit"
        with pytest.raises((TimeoutError, asyncio.TimeoutError)):
            while True:
                msg = await stream.recv(timeout=0.3)
                assert not isinstance(msg, F.ItemBatch) or not len(msg), "items above the majority"
        await stream.close()
