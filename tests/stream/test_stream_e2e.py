"""End to end: a real ``upr server`` process, real WebSocket consumers (``websockets``)."""
from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from engine.protocol import frames as F
from tests.support.server import ServerProcess, start_server
from tests.support.keys import PARTITIONS, key_in, keys_in
from tests.support.stream import engine_contents, is_msg
from tests.support.wsclient import Mirror, Position, RawStream, write_docs, ws_url

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("upr"), partitions=PARTITIONS)
    yield srv
    srv.kill()


def highs(url: str) -> dict[int, int]:
    return {p["partition"]: p["high_seqno"] for p in httpx.get(f"{url}/partitions").json()["partitions"]}


async def catch_up(stream: RawStream, mirror: Mirror, cookie: str) -> dict[str, int]:
    """Send a barrier and consume until it returns; the barrier's seqno vector."""
    await stream.send({"type": "barrier", "cookie": cookie})
    controls = await stream.consume(mirror, until=is_msg("barrier", cookie=cookie))
    return controls[-1]["seqnos"]


@pytest.mark.parametrize("codec", ["binary", "json"])
async def test_full_backfill_equals_server_contents(tmp_path: Path, codec: str) -> None:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS)
    try:
        model: dict[str, bytes] = {}
        keys = [f"doc{i}" for i in range(3000)]
        first = {k: (b"v1-" + k.encode()) * 3 for k in keys}
        write_docs(srv.url, first, durability="persist")  # on disk: the disk part
        model.update(first)
        second = {k: b"v2-" + k.encode() for k in keys[::3]}  # overwrites, only in memory
        second.update({k: None for k in keys[1::7]})  # deletions
        write_docs(srv.url, second)
        for k, v in second.items():
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v

        stream = await RawStream.open(srv.url, codec=codec, name=f"backfill-{codec}")
        assert stream.failover["partition_count"] == PARTITIONS
        responses = await stream.stream(range(PARTITIONS), Mirror())
        assert {r["status"] for r in responses.values()} == {"ok"}
        mirror = Mirror()
        for r in responses.values():
            mirror.on_response(r)
        seqnos = await catch_up(stream, mirror, "done")
        await stream.close()

        assert {k: v for k, (_, v) in mirror.docs.items()} == model
        expected_highs = highs(srv.url)
        assert {int(p): s for p, s in seqnos.items()} == expected_highs
        for p, pos in mirror.positions.items():
            assert pos.seqno == pos.snap_end == expected_highs[p]  # at a snapshot boundary
        # per partition, items arrive in strictly increasing seqno order
        last: dict[int, int] = {}
        for p, seqno, _, _ in mirror.log:
            assert seqno > last.get(p, 0)
            last[p] = seqno
    finally:
        srv.stop()
    docs, _ = engine_contents(srv.data_dir)
    assert docs == model


async def test_backfill_bigger_than_one_reader_job_arrives_whole_and_in_order(server: ServerProcess) -> None:
    """~1.2 MB persisted over 8 partitions: a pass's first reader-thread job stops at the
    256 KiB chunk budget and the visits it did not reach go on in later jobs (and partitions
    bigger than the budget in jobs of their own); every item still arrives once, in seqno order,
    each partition ending at a snapshot boundary, for both codecs on one connection each."""
    docs = {f"big{i}": (b"%06d" % i) * 50 for i in range(4000)}  # 300-byte values
    write_docs(server.url, docs, durability="persist")
    for codec in ("binary", "json"):
        stream = await RawStream.open(server.url, codec=codec, name=f"big-{codec}")
        mirror = Mirror()
        responses = await stream.stream(range(PARTITIONS), mirror)
        for r in responses.values():
            mirror.on_response(r)
        seqnos = await catch_up(stream, mirror, "big")
        await stream.close()
        got = {k: v for k, (_, v) in mirror.docs.items() if k.startswith("big")}
        assert got == docs
        expected = highs(server.url)
        assert {int(p): s for p, s in seqnos.items()} == expected
        for p, pos in mirror.positions.items():
            assert pos.seqno == pos.snap_end == expected[p]
        last: dict[int, int] = {}
        for p, seqno, _, _ in mirror.log:
            assert seqno > last.get(p, 0)
            last[p] = seqno


async def test_resume_from_saved_position_gets_only_newer_items(server: ServerProcess) -> None:
    keys = [f"resume{i}" for i in range(400)]
    write_docs(server.url, {k: b"old" for k in keys})
    mirror = Mirror()
    stream = await RawStream.open(server.url, name="resumer")
    await stream.stream(range(PARTITIONS), mirror)
    await catch_up(stream, mirror, "c1")
    await stream.close()
    saved = {p: Position(pos.uuid, pos.seqno, pos.snap_start, pos.snap_end) for p, pos in mirror.positions.items()}
    assert all(pos.uuid != 0 for pos in saved.values())

    newer = {k: b"new" for k in keys[:50]}
    newer.update({f"fresh{i}": b"fresh" for i in range(30)})
    write_docs(server.url, newer)

    mirror2 = Mirror(positions={p: Position(**vars(pos)) for p, pos in saved.items()})
    stream = await RawStream.open(server.url, name="resumer")
    responses = await stream.stream(range(PARTITIONS), mirror2)
    assert all(r["status"] == "ok" for r in responses.values()), responses
    assert {r["detail"].split(":")[0] for r in responses.values()}  # the rule is explained
    await catch_up(stream, mirror2, "c2")
    await stream.close()
    got = {k for _, _, k, _ in mirror2.log}
    assert got == set(newer)  # nothing older than the saved position came again
    for p, seqno, _, _ in mirror2.log:
        assert seqno > saved[p].seqno
    assert all(mirror2.docs[k][1] == v for k, v in newer.items())


async def test_to_now_stream_ends_at_the_high_seqno(server: ServerProcess) -> None:
    write_docs(server.url, {key_in(2, "tonow"): b"x"})
    high = highs(server.url)[2]
    stream = await RawStream.open(server.url, partitions=[2], name="bounded")
    responses = await stream.stream([2], to_now=True)
    assert responses[2]["status"] == "ok" and responses[2]["end_seqno"] == high
    mirror = Mirror()
    controls = await stream.consume(mirror, until=is_msg("stream_end", partition=2))
    assert controls[-1]["reason"] == "end_seqno_reached" and controls[-1]["last_seqno"] >= high
    assert max(s for _, s, _, _ in mirror.log) == high
    await stream.close()


async def test_close_stream_and_state_change_end_only_that_partition(server: ServerProcess) -> None:
    admin = httpx.Client(base_url=server.url, timeout=10)
    stream = await RawStream.open(server.url, name="ender")
    mirror = Mirror()
    await stream.stream(range(PARTITIONS), mirror)
    await catch_up(stream, mirror, "start")
    await stream.send({"type": "close_stream", "partition": 1})
    controls = await stream.consume(mirror, until=is_msg("stream_end", partition=1))
    assert controls[-1]["reason"] == "closed"
    try:
        assert admin.post("/admin/partitions/5/state", json={"state": "replica"}).status_code == 200
        controls = await stream.consume(mirror, until=is_msg("stream_end", partition=5))
        assert controls[-1]["reason"] == "state_changed"
        # the other partitions keep streaming
        key = key_in(3, "after-state")
        write_docs(server.url, {key: b"still streaming"})
        await catch_up(stream, mirror, "after")
        assert mirror.docs[key][1] == b"still streaming"
        # a new request for the replica partition is refused, not an error
        await stream.send(Position().request(5))
        r = await stream.responses(1)
        assert r[5]["status"] == "not_my_partition"
    finally:
        admin.post("/admin/partitions/5/state", json={"state": "active"})
        admin.close()
        await stream.close()


async def test_positions_check_explains_each_partition(server: ServerProcess) -> None:
    write_docs(server.url, {key_in(p, "pos"): b"x" for p in range(PARTITIONS)})
    parts = httpx.get(f"{server.url}/partitions").json()["partitions"]
    uuid0, high0 = parts[0]["uuid"], parts[0]["high_seqno"]
    body = {"positions": [
        {"partition": 0, "uuid": uuid0, "seqno": high0, "snap_start": high0, "snap_end": high0},
        {"partition": 1, "uuid": 12345, "seqno": 1, "snap_start": 1, "snap_end": 1},
        {"partition": 2, "uuid": 0, "seqno": 0, "snap_start": 0, "snap_end": 0},
        {"partition": 3, "uuid": parts[3]["uuid"], "seqno": 2, "snap_start": 3, "snap_end": 4},
    ]}
    r = httpx.post(f"{server.url}/positions/check", json=body)
    assert r.status_code == 200, r.text
    results = {x["partition"]: x for x in r.json()["results"]}
    assert results[0]["status"] == "ok" and results[0]["rule"] == "same_history" and results[0]["behind"] == 0
    assert results[1]["status"] == "rollback" and results[1]["rule"] == "unknown_uuid"
    assert results[1]["rollback_seqno"] == 0 and results[1]["reason"] == "unknown_uuid"
    assert results[2]["status"] == "ok" and results[2]["rule"] == "from_zero"
    assert results[3]["status"] == "range_error" and results[3]["field"] == "snap_start"

    bad = httpx.post(f"{server.url}/positions/check", json={"positions": [
        {"partition": 99, "uuid": 0, "seqno": 0, "snap_start": 0, "snap_end": 0}]})
    assert bad.status_code == 404
    assert bad.headers["content-type"].startswith("application/problem+json")
    assert bad.json()["field"] == "positions[0].partition"
    missing = httpx.post(f"{server.url}/positions/check", json={"positions": [{"partition": 0}]})
    assert missing.status_code == 422


async def test_streams_registry_shows_each_consumer(server: ServerProcess) -> None:
    stream = await RawStream.open(server.url, partitions=[0, 1], name="visible-consumer")
    mirror = Mirror()
    await stream.stream([0, 1], mirror)
    await catch_up(stream, mirror, "seen")
    listing = httpx.get(f"{server.url}/streams").json()["streams"]
    mine = [s for s in listing if s["name"] == "visible-consumer"]
    assert len(mine) == 1
    parts = {p["partition"]: p for p in mine[0]["partitions"]}
    assert set(parts) == {0, 1}
    assert parts[0]["last_sent_seqno"] == mirror.positions[0].seqno and parts[0]["lag"] >= 0
    assert parts[0]["purge_distance"] == parts[0]["last_sent_seqno"] - parts[0]["purge_seqno"]
    assert mine[0]["window_bytes"] > 0 and mine[0]["cursor_drops"] == 0
    assert mine[0]["codec"] == "binary" and mine[0]["remote"].startswith("127.0.0.1:")
    await stream.close()
    for _ in range(50):
        if not [s for s in httpx.get(f"{server.url}/streams").json()["streams"] if s["name"] == "visible-consumer"]:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("closed connection still listed in GET /streams")


async def test_auth_is_checked_before_the_upgrade(tmp_path: Path) -> None:
    tokens = {"reader-token-0001": "read", "admin-token-00001": "admin"}
    srv = start_server(tmp_path / "auth", partitions=2, tokens=tokens)
    try:
        for token, status in ((None, 401), ("wrong-token-0000", 401)):
            with pytest.raises(InvalidStatus) as info:
                async with websockets.connect(ws_url(srv.url, token), compression=None):
                    pass
            assert info.value.response.status_code == status
            assert b"problem" in info.value.response.body or info.value.response.body
        stream = await RawStream.open(srv.url, token="reader-token-0001", partitions=[0])
        assert stream.failover["partition_count"] == 2
        await stream.close()
        async with websockets.connect(ws_url(srv.url), compression=None,
                                      additional_headers={"Authorization": "Bearer admin-token-00001"}) as ws:
            await ws.send('{"type":"hello","name":"hdr","protocol":1}')
            assert '"failover_logs"' in await ws.recv()
    finally:
        srv.kill()


def _b64(v: bytes) -> str:
    return base64.b64encode(v).decode()


async def test_many_items_per_frame(server: ServerProcess) -> None:
    keys = keys_in({6}, 2000, prefix="frame")
    write_docs(server.url, {k: b"x" * 200 for k in keys})
    stream = await RawStream.open(server.url, partitions=[6], name="framer")
    await stream.stream([6])
    await stream.send({"type": "barrier", "cookie": "framed"})
    frames = []
    while True:
        msg = await stream.recv()
        if isinstance(msg, F.ItemBatch):
            frames.append(len(msg))
        elif msg.get("cookie") == "framed":
            break
    await stream.close()
    assert sum(frames) >= 2000
    assert max(frames) > 100  # batched, not one item per frame
