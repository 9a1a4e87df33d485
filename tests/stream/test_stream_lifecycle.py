"""Connection lifecycle: server shutdown ends streams with a reason and close 1001; a consumer
process that dies is detected and its resources freed; a consumer that merely idles is kept."""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support.server import ROOT, start_server
from tests.support.wsclient import Mirror, RawStream, write_docs

pytestmark = pytest.mark.slow


async def test_shutdown_ends_every_stream_then_closes_1001(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "srv", partitions=4)
    try:
        write_docs(srv.url, {f"k{i}": b"x" for i in range(100)})
        stream = await RawStream.open(srv.url, name="until-shutdown")
        mirror = Mirror()
        await stream.stream(range(4), mirror)
        await stream.send({"type": "barrier", "cookie": "ready"})
        await stream.consume(mirror, until=lambda m: isinstance(m, dict) and m.get("cookie") == "ready")
        srv.proc.send_signal(signal.SIGTERM)
        ends = {}
        with pytest.raises(ConnectionClosed) as info:
            while True:
                msg = await stream.recv(timeout=20)
                if isinstance(msg, dict) and msg["type"] == "stream_end":
                    ends[msg["partition"]] = msg
        assert info.value.rcvd is not None and info.value.rcvd.code == 1001
        assert set(ends) == {0, 1, 2, 3}
        assert all(e["reason"] == "shutting_down" for e in ends.values())
        assert all(e["last_seqno"] == mirror.positions[p].seqno for p, e in ends.items())
        srv.proc.wait(timeout=20)
    finally:
        srv.kill()


CONSUMER = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from tests.support.wsclient import RawStream
    async def main():
        s = await RawStream.open({url!r}, name="doomed", auto_ack=False)
        await s.stream(range(2))
        print("streaming", flush=True)
        await asyncio.sleep(3600)
    asyncio.run(main())
""")


def listed(url: str) -> set[str]:
    return {s["name"] for s in httpx.get(f"{url}/streams").json()["streams"]}


async def test_a_killed_consumer_is_detected_and_freed(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "srv", partitions=2)
    try:
        write_docs(srv.url, {f"k{i}": b"x" * 2000 for i in range(2000)})  # more than its window
        proc = subprocess.Popen([sys.executable, "-c", CONSUMER.format(root=str(ROOT), url=srv.url)],
                                stdout=subprocess.PIPE, cwd=ROOT)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"streaming"
        deadline = time.monotonic() + 10
        while "doomed" not in listed(srv.url):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while "doomed" in listed(srv.url):
            assert time.monotonic() < deadline, "dead consumer still registered"
            await asyncio.sleep(0.05)
        # the server still serves others
        stream = await RawStream.open(srv.url, name="survivor")
        mirror = Mirror()
        await stream.stream(range(2), mirror)
        await stream.send({"type": "barrier", "cookie": "all"})
        await stream.consume(mirror, until=lambda m: isinstance(m, dict) and m.get("cookie") == "all")
        assert len(mirror.docs) == 2000
        await stream.close()
    finally:
        srv.kill()


async def test_a_silent_consumer_is_dropped_by_the_keepalive(tmp_path: Path) -> None:
    """A consumer process that stops (SIGSTOP: its socket stays open, nothing answers pings) is
    detected by the WebSocket keep-alive (--ws-ping-interval-s / --ws-ping-timeout-s) and freed."""
    srv = start_server(tmp_path / "srv", partitions=2, args=["--ws-ping-interval-s", "1", "--ws-ping-timeout-s", "1"])
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER.format(root=str(ROOT), url=srv.url)],
                            stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"streaming"
        deadline = time.monotonic() + 10
        while "doomed" not in listed(srv.url):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 15
        while "doomed" in listed(srv.url):
            assert time.monotonic() < deadline, "silent consumer never dropped"
            await asyncio.sleep(0.5)
        assert httpx.get(f"{srv.url}/health").status_code == 200
    finally:
        proc.kill()
        proc.wait()
        srv.kill()


async def test_connections_over_the_limit_are_refused_before_the_upgrade(tmp_path: Path) -> None:
    """--stream-max-connections is explicit: one more connection gets a 503 problem document
    (never an open socket), and a slot frees when a connection closes."""
    from websockets.exceptions import InvalidStatus

    srv = start_server(tmp_path / "srv", partitions=2, args=["--stream-max-connections", "2"])
    try:
        first = await RawStream.open(srv.url, name="one")
        second = await RawStream.open(srv.url, name="two")
        with pytest.raises(InvalidStatus) as refused:
            await RawStream.open(srv.url, name="three")
        response = refused.value.response
        assert response.status_code == 503
        assert b"too-many-streams" in response.body and b"--stream-max-connections" in response.body
        await first.close()
        deadline = time.monotonic() + 10
        while "one" in listed(srv.url):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        third = await RawStream.open(srv.url, name="three")
        await third.close()
        await second.close()
    finally:
        srv.kill()


async def test_idle_connections_time_out_and_one_token_cannot_take_every_slot(tmp_path: Path) -> None:
    """Sockets that never send hello are closed after --stream-hello-timeout-s (error
    hello_timeout, 1008), and --stream-max-connections-per-client keeps one token from holding
    every slot: its next connection gets a 429 problem while another token still streams."""
    import json

    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    from tests.support.wsclient import ws_url

    tokens = {"idle-token": "read", "busy-token": "read", "admin-token": "admin"}
    srv = start_server(tmp_path / "srv", partitions=2, tokens=tokens,
                       args=["--stream-max-connections", "3", "--stream-max-connections-per-client", "2",
                             "--stream-hello-timeout-s", "1.5"])
    try:
        idle = [await connect(ws_url(srv.url, "idle-token")) for _ in range(2)]
        with pytest.raises(InvalidStatus) as refused:
            await connect(ws_url(srv.url, "idle-token"))
        response = refused.value.response
        assert response.status_code == 429
        assert response.headers["Retry-After"] == "1"
        assert b"too-many-client-streams" in response.body
        assert b"--stream-max-connections-per-client" in response.body
        busy = await RawStream.open(srv.url, name="busy", token="busy-token")  # the third slot
        await busy.stream([0, 1])
        for ws in idle:
            error = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert (error["type"], error["code"]) == ("error", "hello_timeout"), error
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        # the slots are free again
        again = await RawStream.open(srv.url, name="again", token="idle-token")
        write_docs(srv.url, {"k": b"v"}, headers=srv.headers)
        await busy.send({"type": "barrier", "cookie": "still"})
        await busy.consume(Mirror(), until=lambda m: isinstance(m, dict) and m.get("cookie") == "still")
        await again.close()
        await busy.close()
    finally:
        srv.kill()


async def test_a_partition_demoted_mid_snapshot_ends_its_stream_at_once(tmp_path: Path) -> None:
    """A stream in the middle of a snapshot (stalled on a full window) ends with
    ``state_changed`` as soon as its partition becomes a replica: the consumer never gets the
    rest of that snapshot from a node that is no longer the partition's active copy."""
    from engine.protocol import frames as F
    from tests.support.keys import key_in

    srv = start_server(tmp_path / "srv", partitions=2)
    try:
        write_docs(srv.url, {key_in(0, f"big{i}", partitions=2): b"x" * 1000 for i in range(1000)})
        stream = await RawStream.open(srv.url, partitions=[0], name="demoted", window=4096, auto_ack=False)
        await stream.stream([0])
        mirror = Mirror()
        await stream.consume(mirror, until=lambda m: isinstance(m, F.ItemBatch))  # mid-snapshot now
        assert httpx.post(f"{srv.url}/admin/partitions/0/state", json={"state": "replica"},
                          timeout=10).status_code == 200
        stream.auto_ack = True
        await stream.ack()
        after: list[F.ItemBatch] = []
        controls: list[dict] = []
        while not controls or controls[-1].get("type") != "stream_end":
            msg = await stream.recv(timeout=10)
            (after if isinstance(msg, F.ItemBatch) else controls).append(msg)
        assert controls[-1]["reason"] == "state_changed", controls
        assert not any(batch.last for batch in after), "the snapshot went on after the state change"
        assert len(mirror.docs) + sum(len(b) for b in after) < 1000
        await stream.close()
    finally:
        srv.kill()
