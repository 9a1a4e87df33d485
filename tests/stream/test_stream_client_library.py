"""The stream server with the real client library (``clients.Consumer``): a consumer whose handler
stalls in the middle of a large disk snapshot makes the server release its snapshot (cursor
dropping) and continue it later with a continuation marker; the consumer still ends with exactly
the server's contents."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from clients import Consumer
from clients.events import Deletion, Mutation
from clients.state import MemoryStateStore
from tests.support.server import start_server
from tests.support.wsclient import write_docs

pytestmark = pytest.mark.slow


async def test_consumer_stalled_mid_snapshot_survives_cursor_dropping(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "srv", partitions=1)
    try:
        model = {f"doc{i}": b"%06d" % i * 150 for i in range(3000)}
        write_docs(srv.url, model, durability="persist")  # one 2.7 MB disk snapshot
        got: dict[str, bytes] = {}
        stalled = False
        async with Consumer(srv.url, name="stalling", start="beginning", state=MemoryStateStore(),
                            window_bytes=64 * 1024, until_now=False, codec="binary") as consumer:
            async for event in consumer:
                if isinstance(event, Mutation):
                    got[event.key] = event.value
                    if len(got) == 300 and not stalled:
                        stalled = True
                        # stall mid-snapshot; meanwhile newer versions are written and persisted
                        newer = {f"doc{i}": b"newer" for i in range(0, 3000, 10)}
                        await asyncio.to_thread(write_docs, srv.url, newer, None, "persist")
                        model.update(newer)
                        await asyncio.sleep(4.0)
                elif isinstance(event, Deletion):
                    got.pop(event.key, None)
                if len(got) == len(model) and all(got.get(k) == v for k, v in model.items()):
                    break
        assert got == model
        metrics = httpx.get(f"{srv.url}/metrics").text
        drops = [float(x.split()[-1]) for x in metrics.splitlines() if x.startswith("upr_stream_cursor_drops_total")]
        assert drops and drops[0] >= 1, "the stall did not make the server release the snapshot"
    finally:
        srv.kill()


def test_client_position_accepts_a_continuation_marker_and_nothing_else_mid_snapshot() -> None:
    from clients.errors import ProtocolViolation
    from engine.protocol.client.position import PartitionPosition, PositionState

    pos = PartitionPosition(0)
    pos.snapshot_marker(1, 100)
    pos.items(1, 40)
    assert pos.state is PositionState.IN_SNAPSHOT
    pos.snapshot_marker(41, 130)  # continuation: the rest, from the next seqno, to a later end
    assert (pos.state, pos.seqno, pos.snap_start, pos.snap_end) == (PositionState.IN_SNAPSHOT, 40, 1, 130)
    pos.items(41, 125)
    pos.snapshot_end()
    assert (pos.seqno, pos.snap_start, pos.snap_end) == (130, 1, 130)
    pos.snapshot_marker(131, 140)
    pos.item(131)
    for start, end in ((133, 150), (131, 150), (132, 139)):  # a gap, an overlap, or a shrinking end
        with pytest.raises(ProtocolViolation):
            pos.snapshot_marker(start, end)


async def test_a_consumer_asking_for_packed_passes_tails_to_the_servers_contents(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Consumer(frames="packed")``: the tail's passes come packed, and the consumer's events
    are those of the markers and batches they stand for."""
    import clients.connection as connection

    packed_seen = 0
    decode = connection.decode_frame

    def counting(frame: str | bytes) -> object:
        nonlocal packed_seen
        if isinstance(frame, bytes) and frame[:4] == b"UPRP":
            packed_seen += 1
        return decode(frame)

    monkeypatch.setattr(connection, "decode_frame", counting)
    srv = start_server(tmp_path / "srv", partitions=8)
    try:
        batches: list[dict[str, bytes | None]] = []
        model: dict[str, bytes | None] = {}
        for i in range(0, 60, 6):
            batch: dict[str, bytes | None] = {f"k{j}": b"v%d" % j for j in range(i, i + 6)}
            if i:
                batch[f"k{i - 3}"] = None
            batches.append(batch)
            model.update(batch)
        got: dict[str, bytes] = {}

        async def writes() -> None:
            for batch in batches:
                await asyncio.to_thread(write_docs, srv.url, batch)
                await asyncio.sleep(0.05)

        async with Consumer(srv.url, name="packed", start="beginning", state=MemoryStateStore(), codec="binary",
                            frames="packed") as consumer:
            task = asyncio.create_task(writes())
            async for event in consumer:
                if isinstance(event, Mutation):
                    got[event.key] = event.value
                elif isinstance(event, Deletion):
                    got.pop(event.key, None)
                if got == {k: v for k, v in model.items() if v is not None}:
                    break
            await task
        assert packed_seen > 0
        assert got == {k: v for k, v in model.items() if v is not None}
    finally:
        srv.kill()


def test_a_consumer_refuses_packed_passes_without_binary_bundles() -> None:
    from clients.errors import UsageError

    with pytest.raises(UsageError) as err:
        Consumer("http://127.0.0.1:1", name="x", codec="json", frames="packed", state=MemoryStateStore())
    assert err.value.field == "frames"
    with pytest.raises(UsageError):
        Consumer("http://127.0.0.1:1", name="x", frames="squashed", state=MemoryStateStore())
