"""Bundle frames on a real server: only for clients that ask, same messages in the same order,
and the flow-control window bounds them exactly as it bounds single messages."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.server import start_server
from tests.support.wsclient import Mirror, RawStream, write_docs

PARTITIONS = 8
WINDOW = 16 * 1024
FRAME_BYTES = 64 * 1024  # StreamLimits.frame_bytes == bundle_bytes: the most one frame may overshoot


@pytest.mark.parametrize("bundle", [False, True], ids=["messages", "bundles"])
async def test_a_stalled_consumer_gets_at_most_the_window_plus_one_frame(tmp_path: Path, bundle: bool) -> None:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS)
    try:
        stream = await RawStream.open(srv.url, name="stalled", window=WINDOW, auto_ack=False, bundle=bundle)
        await stream.stream(range(PARTITIONS))
        write_docs(srv.url, {f"k{i}": b"v" * 100 for i in range(3000)})  # ~400 KiB encoded, all partitions
        received = 0
        while True:
            try:
                data = await asyncio.wait_for(stream.ws.recv(), 1.0)
            except asyncio.TimeoutError:
                break  # the server stopped: the window is used up
            received += len(data) if isinstance(data, bytes) else len(data.encode())
        assert WINDOW <= received <= WINDOW + FRAME_BYTES, received
        await stream.close()
    finally:
        srv.kill()


async def test_a_pass_arrives_bundled_with_every_marker_before_its_items(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS)
    try:
        plain, bundled = Mirror(), Mirror()
        a = await RawStream.open(srv.url, name="plain")
        b = await RawStream.open(srv.url, name="bundled", bundle=True)
        await a.stream(range(PARTITIONS), plain)
        await b.stream(range(PARTITIONS), bundled)
        docs = {f"k{i}": b"%d" % i for i in range(500)}
        write_docs(srv.url, docs)
        write_docs(srv.url, {"k1": None, "k2": b"again"})
        for s, m in ((a, plain), (b, bundled)):
            await s.send({"type": "barrier", "cookie": "done"})
            # Mirror.on_batch takes the snapshot range of the marker seen before: a batch ahead of
            # its marker would leave the position's snapshot range unset
            await s.consume(m, until=lambda msg: isinstance(msg, dict) and msg.get("cookie") == "done")
        assert b.bundles > 0 and a.bundles == 0
        assert bundled.docs == plain.docs and {k: v for k, (_, v) in plain.docs.items()} == {
            **{k: v for k, v in docs.items() if k != "k1"}, "k2": b"again"}
        assert {p: vars(x) for p, x in bundled.positions.items()} == {p: vars(x) for p, x in plain.positions.items()}
        assert all(x.snap_end >= x.seqno > 0 for x in bundled.positions.values())
        await a.close()
        await b.close()
    finally:
        srv.kill()


async def test_a_packed_consumer_gets_the_same_stream_in_packed_passes(tmp_path: Path) -> None:
    """hello ``frames: packed``: the tail's passes arrive as packed passes standing for the same
    markers and batches, and the documents, positions and cookies come out as for bundles."""
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS)
    try:
        bundled, packed = Mirror(), Mirror()
        a = await RawStream.open(srv.url, name="bundled", bundle=True)
        b = await RawStream.open(srv.url, name="packed", bundle=True, frames="packed")
        await a.stream(range(PARTITIONS), bundled)
        await b.stream(range(PARTITIONS), packed)
        docs = {f"k{i}": b"%d" % i for i in range(40)}
        for i in range(0, 40, 5):  # small writes, each a tail pass over a few partitions
            write_docs(srv.url, {k: docs[k] for k in list(docs)[i:i + 5]})
        write_docs(srv.url, {"k1": None, "k2": b"again"})
        for s, m in ((a, bundled), (b, packed)):
            await s.send({"type": "barrier", "cookie": "done"})
            await s.consume(m, until=lambda msg: isinstance(msg, dict) and msg.get("cookie") == "done")
        assert b.packed > 0 and a.packed == 0
        assert packed.docs == bundled.docs and {k: v for k, (_, v) in packed.docs.items()} == {
            **{k: v for k, v in docs.items() if k != "k1"}, "k2": b"again"}
        assert {p: vars(x) for p, x in packed.positions.items()} == {p: vars(x) for p, x in bundled.positions.items()}
        await a.close()
        await b.close()
    finally:
        srv.kill()


async def test_a_stalled_packed_consumer_gets_at_most_the_window_plus_one_frame(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS)
    try:
        stream = await RawStream.open(srv.url, name="stalled", window=WINDOW, auto_ack=False, bundle=True,
                                      frames="packed")
        await stream.stream(range(PARTITIONS))
        for i in range(0, 600, 20):  # tail passes, then a backlog once the window is full
            write_docs(srv.url, {f"k{j}": b"v" * 100 for j in range(i, i + 20)})
        received = stream.unacked  # the answers to hello and the stream requests count too
        while True:
            try:
                data = await asyncio.wait_for(stream.ws.recv(), 1.0)
            except asyncio.TimeoutError:
                break
            received += len(data) if isinstance(data, bytes) else len(data.encode())
        assert WINDOW <= received <= WINDOW + FRAME_BYTES, received
        await stream.close()
    finally:
        srv.kill()

