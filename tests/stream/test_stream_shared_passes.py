"""Many consumers tailing the same partitions, most of them on shared passes (bundling, uncapped)
and the rest not (no bundles, a small window, ``persisted`` visibility, the JSON codec): each one
receives exactly the sequence a lone consumer would, and every barrier cookie comes back only
after the consumer holds every write acknowledged before it was sent."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.support.server import start_server
from tests.support.wsclient import Mirror, RawStream, write_docs, ws_url

pytestmark = pytest.mark.slow

PARTITIONS = 8
ROUNDS = 15
PER_ROUND = 20

#: (codec, bundle, window, visibility): the first kinds take shared passes, the others never or
#: only sometimes (a 4 KiB window often has no room for a whole pass)
KINDS = [
    ("binary", True, None, "memory"),
    ("json", True, None, "memory"),
    ("binary", True, None, "memory"),
    ("binary", True, 4096, "memory"),
    ("binary", False, None, "memory"),
    ("json", False, 4096, "memory"),
    ("binary", True, None, "persisted"),
    ("json", True, None, "majority"),
]
CONSUMERS = 16


async def open_stream(url: str, name: str, codec: str, bundle: bool, window: int | None,
                      visibility: str) -> RawStream:
    ws = await connect(ws_url(url), compression=None, max_size=None, open_timeout=10, max_queue=16)
    s = RawStream(ws)
    s.window = window or 0
    await s.send({"type": "hello", "name": name, "codec": codec, "window_bytes": window, "partitions": None,
                  "protocol": 1, "bundle": bundle, "visibility": visibility})
    msg = await s.recv()
    assert isinstance(msg, dict) and msg["type"] == "failover_logs", msg
    return s


async def test_many_consumers_each_get_the_lone_consumer_sequence_and_exact_cookies(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS)
    try:
        written: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}

        def record(results: list[dict[str, Any]]) -> None:
            for r in results:
                written[r["partition"]].append((r["seqno"], r["key"]))

        record(write_docs(srv.url, {f"base{i}": b"base" for i in range(200)}))
        kinds = [KINDS[i % len(KINDS)] for i in range(CONSUMERS)]
        streams = [await open_stream(srv.url, f"shared-{i}", *kind) for i, kind in enumerate(kinds)]
        mirrors = [Mirror() for _ in streams]
        for s, m in zip(streams, mirrors):
            await s.stream(range(PARTITIONS), m)

        cookies: list[dict[str, dict[int, int]]] = [{} for _ in streams]
        released: list[list[str]] = [[] for _ in streams]
        stop = asyncio.Event()

        def on_message(i: int, msg: Any) -> bool:
            if isinstance(msg, dict) and msg.get("type") == "barrier":
                required = cookies[i].pop(msg["cookie"])
                for p, seqno in required.items():
                    assert mirrors[i].positions[p].seqno >= seqno, (i, kinds[i], msg["cookie"], p)
                released[i].append(msg["cookie"])
            return False

        async def follow(i: int) -> None:
            while not stop.is_set() or cookies[i]:
                try:
                    await streams[i].consume(mirrors[i], until=lambda msg: on_message(i, msg), timeout=0.2)
                except TimeoutError:
                    pass

        async def cookie_all(name: str) -> None:
            high = {p: max(s for s, _ in items) for p, items in written.items() if items}
            for i, s in enumerate(streams):
                cookies[i][name] = dict(high)
                await s.send({"type": "barrier", "cookie": name})

        followers = [asyncio.create_task(follow(i)) for i in range(len(streams))]
        for r in range(ROUNDS):
            docs: dict[str, bytes | None] = {f"r{r}-{j}": f"value {r} {j}".encode() for j in range(PER_ROUND)}
            record(await asyncio.to_thread(write_docs, srv.url, docs))
            if r % 5 == 4:
                await cookie_all(f"c{r}")
            await asyncio.sleep(0.005)
        await cookie_all("end")
        stop.set()
        await asyncio.wait_for(asyncio.gather(*followers), 60)

        expected = {p: sorted(items) for p, items in written.items()}
        for i, m in enumerate(mirrors):
            got: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
            for p, seqno, key, deleted in m.log:
                assert not deleted
                got[p].append((seqno, key))
            assert got == expected, f"consumer {i} {kinds[i]} did not get the lone consumer's sequence"
            assert released[i] == [f"c{r}" for r in range(ROUNDS) if r % 5 == 4] + ["end"], (i, released[i])
            assert (streams[i].bundles > 0) == kinds[i][1], (i, kinds[i])  # bundles only to those that accept them
        for s in streams:
            await s.close()
        assert httpx.get(f"{srv.url}/health").status_code == 200
    finally:
        srv.kill()
