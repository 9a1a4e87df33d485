"""``visibility: persisted`` against a real server: a consumer that never receives what an
unclean restart could take back.

The server runs with a flush interval of a minute, so writes acknowledged with memory durability
stay unpersisted until the test flushes (``POST /admin/flush``, which answers with the persisted
seqnos): the server's persisted seqno is then known exactly at every moment, and every item a
``persisted`` consumer receives can be checked against it.  A ``memory`` consumer beside it shows
the same writes do stream, and, after a SIGKILL, is told to roll back while the ``persisted``
consumer resumes as if nothing happened.
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from engine.protocol import frames as F
from tests.support.keys import PARTITIONS, keys_in
from tests.support.server import ServerProcess, start_server
from tests.support.stream import is_msg
from tests.support.wsclient import Mirror, Position, RawStream, write_docs, ws_url

SLOW_FLUSH = ["--flush-interval-ms", "60000"]


async def open_stream(url: str, *, name: str, visibility: str) -> RawStream:
    """``RawStream.open`` with a ``visibility`` in hello."""
    ws = await connect(ws_url(url), compression=None, max_size=None, open_timeout=10)
    stream = RawStream(ws)
    await stream.send({"type": "hello", "name": name, "codec": "binary", "protocol": 1, "visibility": visibility})
    msg = await stream.recv()
    assert isinstance(msg, dict) and msg["type"] == "failover_logs", msg
    stream.failover = msg
    return stream


def persisted_seqnos(url: str) -> dict[int, int]:
    parts = httpx.get(f"{url}/partitions").json()["partitions"]
    return {p["partition"]: p["persisted_seqno"] for p in parts}


def flush(url: str) -> dict[int, int]:
    r = httpx.post(f"{url}/admin/flush", timeout=60)
    r.raise_for_status()
    return {int(p): s for p, s in r.json()["persisted_seqnos"].items()}


async def drain(stream: RawStream, mirror: Mirror, seconds: float) -> list[Any]:
    """Whatever arrives within ``seconds`` (the absence of items is what the caller checks)."""
    got: list[Any] = []
    try:
        await stream.consume(mirror, until=lambda m: got.append(m) and False, timeout=seconds)
    except (TimeoutError, asyncio.TimeoutError):
        pass
    return got


def checked_mirror(ceilings: dict[int, int]) -> Mirror:
    """A mirror that fails on any item above ``ceilings`` (updated by the test as it flushes)."""

    class Checked(Mirror):
        def on_batch(self, batch: F.ItemBatch) -> None:
            for seqno in batch.seqnos:
                assert seqno <= ceilings[batch.partition], (
                    f"partition {batch.partition}: seqno {seqno} delivered above the persisted seqno "
                    f"{ceilings[batch.partition]}")
            super().on_batch(batch)

        def on_marker(self, msg: dict[str, Any]) -> None:
            assert msg["end"] <= ceilings[msg["partition"]], f"marker promises unpersisted seqnos: {msg}"
            super().on_marker(msg)

    return Checked()


@pytest.fixture
def slow_flush_server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS, args=SLOW_FLUSH)
    yield srv
    srv.kill()


async def test_a_persisted_consumer_tailing_writes_never_gets_past_the_persisted_seqno(
    slow_flush_server: ServerProcess,
) -> None:
    url = slow_flush_server.url
    write_docs(url, {k: b"durable" for k in keys_in(set(range(PARTITIONS)), 80, prefix="d")}, durability="persist")
    ceilings = persisted_seqnos(url)  # nothing else flushes: this is the server's persisted seqno
    mirror = checked_mirror(ceilings)
    stream = await open_stream(url, name="indexer", visibility="persisted")
    memory = await RawStream.open(url, name="memory-tail")
    memory_mirror = Mirror()
    responses = await stream.stream(range(PARTITIONS), mirror)
    assert {r["status"] for r in responses.values()} == {"ok"}
    await memory.stream(range(PARTITIONS), memory_mirror)
    await stream.send({"type": "barrier", "cookie": "start"})
    done = await stream.consume(mirror, until=is_msg("barrier", cookie="start"))
    assert {int(p): s for p, s in done[-1]["seqnos"].items()} == ceilings

    for round_ in range(4):
        volatile = {k: f"round {round_}".encode() for k in keys_in(set(range(PARTITIONS)), 40, prefix=f"v{round_}-")}
        write_docs(url, volatile)  # acknowledged in memory only
        await memory.send({"type": "barrier", "cookie": f"m{round_}"})
        await memory.consume(memory_mirror, until=is_msg("barrier", cookie=f"m{round_}"))
        assert all(memory_mirror.docs[k][1] == v for k, v in volatile.items())  # they do stream
        await stream.send({"type": "barrier", "cookie": f"r{round_}"})
        held = await drain(stream, mirror, 0.5)
        assert not [m for m in held if isinstance(m, F.ItemBatch) and len(m)], "unpersisted items delivered"
        assert not [m for m in held if isinstance(m, dict) and m["type"] == "barrier"], "cookie before persistence"

        ceilings.update(flush(url))
        # writes made after the flush must wait for the next one, whatever this round delivers
        later = {k: b"after the flush" for k in keys_in(set(range(PARTITIONS)), 16, prefix=f"later{round_}-")}
        writer = threading.Thread(target=write_docs, args=(url, later))
        writer.start()
        try:
            got = await stream.consume(mirror, until=is_msg("barrier", cookie=f"r{round_}"))
        finally:
            writer.join()
        seqnos = {int(p): s for p, s in got[-1]["seqnos"].items()}
        assert all(seqnos[p] <= ceilings[p] for p in range(PARTITIONS))
        assert all(mirror.docs[k][1] == v for k, v in volatile.items())  # everything persisted arrived

    ceilings.update(flush(url))
    await stream.send({"type": "barrier", "cookie": "end"})
    got = await stream.consume(mirror, until=is_msg("barrier", cookie="end"))
    assert {int(p): s for p, s in got[-1]["seqnos"].items()} == ceilings  # once flushed, all of it
    await memory.send({"type": "barrier", "cookie": "end"})
    await memory.consume(memory_mirror, until=is_msg("barrier", cookie="end"))
    assert {k: v for k, (_s, v) in mirror.docs.items()} == {k: v for k, (_s, v) in memory_mirror.docs.items()}
    await stream.close()
    await memory.close()


async def test_a_bad_visibility_is_refused_with_a_typed_error(slow_flush_server: ServerProcess) -> None:
    async with connect(ws_url(slow_flush_server.url)) as ws:
        await ws.send(json.dumps({"type": "hello", "name": "x", "visibility": "eventually"}))
        error = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (error["type"], error["code"], error["field"]) == ("error", "invalid_field", "visibility")
        with pytest.raises(Exception):
            await asyncio.wait_for(ws.recv(), 10)
        assert ws.close_code == 1008


AFFECTED = {1, 4, 6}


@pytest.mark.slow
async def test_after_a_sigkill_the_persisted_consumer_resumes_without_rollback_and_the_memory_one_rolls_back(
    tmp_path: Path,
) -> None:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS, args=SLOW_FLUSH)
    try:
        write_docs(srv.url, {k: b"durable" for k in keys_in(set(range(PARTITIONS)), 200, prefix="d")},
                   durability="persist")
        persisted = persisted_seqnos(srv.url)
        safe, safe_mirror = await open_stream(srv.url, name="safe", visibility="persisted"), checked_mirror(persisted)
        fast, fast_mirror = await RawStream.open(srv.url, name="fast"), Mirror()
        await safe.stream(range(PARTITIONS), safe_mirror)
        await fast.stream(range(PARTITIONS), fast_mirror)
        write_docs(srv.url, {k: b"only in memory" for k in keys_in(AFFECTED, 60, prefix="m")})
        await fast.send({"type": "barrier", "cookie": "b"})
        await fast.consume(fast_mirror, until=is_msg("barrier", cookie="b"))
        assert {p for p in range(PARTITIONS) if fast_mirror.positions[p].seqno > persisted[p]} == AFFECTED
        await safe.send({"type": "barrier", "cookie": "b"})
        await drain(safe, safe_mirror, 0.5)  # the checked mirror fails on anything unpersisted
        assert all(safe_mirror.positions[p].seqno == persisted[p] for p in range(PARTITIONS))
        saved_safe = {p: Position(**vars(pos)) for p, pos in safe_mirror.positions.items()}
        saved_fast = {p: Position(**vars(pos)) for p, pos in fast_mirror.positions.items()}
    finally:
        srv.kill()  # SIGKILL with unflushed writes: they are lost

    srv = start_server(tmp_path / "srv", data_dir=srv.data_dir, partitions=PARTITIONS, args=SLOW_FLUSH)
    try:
        safe_mirror = checked_mirror(persisted)
        safe_mirror.positions = saved_safe
        safe = await open_stream(srv.url, name="safe", visibility="persisted")
        responses = await safe.stream(range(PARTITIONS), safe_mirror)
        assert {p: r["status"] for p, r in responses.items()} == {p: "ok" for p in range(PARTITIONS)}

        fast_mirror = Mirror(positions=saved_fast)
        fast = await RawStream.open(srv.url, name="fast")
        responses = await fast.stream(range(PARTITIONS), fast_mirror)
        rolled = {p: r["rollback_seqno"] for p, r in responses.items() if r["status"] == "rollback"}
        assert rolled == {p: persisted[p] for p in AFFECTED}

        # the safe consumer streams on from where it was: new writes, once persisted
        fresh = {k: b"after restart" for k in keys_in(set(range(PARTITIONS)), 20, prefix="f")}
        write_docs(srv.url, fresh)
        persisted.update(flush(srv.url))
        await safe.send({"type": "barrier", "cookie": "again"})
        got = await safe.consume(safe_mirror, until=is_msg("barrier", cookie="again"))
        assert {int(p): s for p, s in got[-1]["seqnos"].items()} == persisted
        assert all(safe_mirror.docs[k][1] == b"after restart" for k in fresh)
        await safe.close()
        await fast.close()
    finally:
        srv.kill()


async def test_the_client_library_asks_for_persisted_visibility(slow_flush_server: ServerProcess) -> None:
    from clients import BarrierReached, Consumer, Mutation
    from clients.errors import UsageError
    from clients.state import MemoryStateStore

    url = slow_flush_server.url
    with pytest.raises(UsageError):
        Consumer(url, name="x", visibility="eventually", state=MemoryStateStore())
    write_docs(url, {k: b"durable" for k in keys_in(set(range(PARTITIONS)), 40, prefix="d")}, durability="persist")
    got: dict[str, bytes] = {}
    barriers: asyncio.Queue[BarrierReached] = asyncio.Queue()

    async with Consumer(url, name="safe-client", start="beginning", state=MemoryStateStore(),
                        visibility="persisted") as consumer:

        async def consume() -> None:
            async for event in consumer:
                if isinstance(event, Mutation):
                    got[event.key] = event.value
                elif isinstance(event, BarrierReached):
                    barriers.put_nowait(event)

        consumer.request_barrier()  # sent once the reader connects
        reader = asyncio.ensure_future(consume())
        try:
            first = await asyncio.wait_for(barriers.get(), 30)
            assert first.seqnos == persisted_seqnos(url)
            volatile = {k: b"volatile" for k in keys_in(set(range(PARTITIONS)), 40, prefix="v")}
            write_docs(url, volatile)
            consumer.request_barrier()
            await asyncio.sleep(0.5)
            assert barriers.empty() and not set(volatile) & set(got)  # not persisted: not delivered
            persisted = await asyncio.to_thread(flush, url)
            reached = await asyncio.wait_for(barriers.get(), 30)
            assert reached.seqnos == persisted
            assert all(got[k] == b"volatile" for k in volatile)
        finally:
            reader.cancel()
