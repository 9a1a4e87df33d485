"""Many consumers tailing the same partitions while writers run (they share encoded tail
snapshots on the server): every one of them ends with exactly the written state."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.support.server import start_server
from tests.support.wsclient import Mirror, RawStream, write_docs

pytestmark = pytest.mark.slow

PARTITIONS = 8
CONSUMERS = 12


async def test_concurrent_tailing_consumers_all_converge_on_the_written_state(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS)
    try:
        write_docs(srv.url, {f"base{i}": b"base" for i in range(500)})
        codecs = ["binary", "json"]
        # half of them accept bundles (several messages per WebSocket message), with either codec
        streams = [await RawStream.open(srv.url, name=f"fan-{i}", codec=codecs[i % 2], bundle=i % 4 >= 2)
                   for i in range(CONSUMERS)]
        mirrors = [Mirror() for _ in streams]
        for s, m in zip(streams, mirrors):
            await s.stream(range(PARTITIONS), m)

        model = {f"base{i}": b"base" for i in range(500)}
        rnd = random.Random(7)

        async def write_rounds() -> None:
            for r in range(30):
                docs: dict[str, bytes | None] = {}
                for _ in range(40):
                    key = f"k{rnd.randrange(300)}"
                    docs[key] = None if rnd.random() < 0.2 and key in model else f"r{r}".encode()
                await asyncio.to_thread(write_docs, srv.url, docs)
                for k, v in docs.items():
                    if v is None:
                        model.pop(k, None)
                    else:
                        model[k] = v
                await asyncio.sleep(0.01)

        async def follow(s: RawStream, m: Mirror, stop: asyncio.Event) -> None:
            while not stop.is_set():
                try:
                    await s.consume(m, until=lambda msg: False, timeout=0.2)
                except TimeoutError:
                    pass

        stop = asyncio.Event()
        followers = [asyncio.create_task(follow(s, m, stop)) for s, m in zip(streams, mirrors)]
        await write_rounds()
        stop.set()
        await asyncio.gather(*followers)
        for i, (s, m) in enumerate(zip(streams, mirrors)):
            await s.send({"type": "barrier", "cookie": f"end-{i}"})
            await s.consume(m, until=lambda msg, i=i: isinstance(msg, dict) and msg.get("cookie") == f"end-{i}")
            assert {k: v for k, (_, v) in m.docs.items()} == model, f"consumer {i} diverged"
            assert (s.bundles > 0) == (i % 4 >= 2), (i, s.bundles)  # bundles only to those that accept them
            await s.close()
    finally:
        srv.kill()
