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
