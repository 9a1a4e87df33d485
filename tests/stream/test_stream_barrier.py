"""Barrier cookies under concurrent writers on many partitions.

The guarantee: every mutation acknowledged to a writer before the cookie was sent is delivered
before the cookie comes back.  Writers in threads hammer every partition; the consumer repeatedly
notes which writes have been acknowledged, sends a cookie, and when it returns checks that each
of those writes has arrived (at its seqno or, deduplicated, at a later version of its key).
"""
from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import ServerProcess, start_server
from tests.support.wsclient import Mirror, RawStream

pytestmark = pytest.mark.slow

PARTITIONS = 16


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS)
    yield srv
    srv.kill()


class Writers:
    """Threads writing random keys with small bulk requests; ``acked`` grows as answers come back."""

    def __init__(self, url: str, threads: int = 3) -> None:
        self.url = url
        self.acked: list[tuple[str, int, int]] = []  # (key, partition, seqno), in ack order
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, index: int) -> None:
        rnd = random.Random(index)
        with httpx.Client(base_url=self.url, timeout=30) as client:
            n = 0
            while not self.stop.is_set():
                batch = [{"op": "set", "key": f"w{rnd.randrange(3000)}", "value": {"w": index, "n": n + i}}
                         for i in range(rnd.randrange(1, 20))]
                n += len(batch)
                results = client.post("/docs/_bulk", json=batch).json()["results"]
                with self.lock:
                    self.acked += [(r["key"], r["partition"], r["seqno"]) for r in results if r["status"] == 200]

    def __enter__(self) -> "Writers":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


@pytest.mark.parametrize("bundle", [False, True], ids=["messages", "bundles"])
async def test_every_write_acknowledged_before_the_cookie_is_delivered_before_it_returns(
    server: ServerProcess, bundle: bool,
) -> None:
    stream = await RawStream.open(server.url, name="barrier-checker", window=1 << 20, bundle=bundle)
    mirror = Mirror()
    latest: dict[str, int] = {}  # key -> highest seqno delivered

    await stream.stream(range(PARTITIONS), mirror)
    checked = 0
    with Writers(server.url) as writers:
        while len(writers.acked) < 100:
            time.sleep(0.05)
        for round_no in range(25):
            await asyncio.sleep(0.04)  # let more writes get acknowledged between cookies
            with writers.lock:
                before = list(writers.acked)  # acknowledged before the cookie is sent
            cookie = f"cookie-{round_no}"
            await stream.send({"type": "barrier", "cookie": cookie})
            start = len(mirror.log)
            controls = await stream.consume(mirror, until=lambda m: isinstance(m, dict) and m.get("cookie") == cookie)
            for _, seqno, key, _ in mirror.log[start:]:
                latest[key] = max(latest.get(key, 0), seqno)
            missing = [(k, p, s) for k, p, s in before if latest.get(k, 0) < s]
            assert not missing, f"round {round_no}: {len(missing)} acknowledged writes not delivered: {missing[:5]}"
            seqnos = {int(p): s for p, s in controls[-1]["seqnos"].items()}
            for k, p, s in before:
                assert seqnos[p] >= s  # the cookie's seqno vector covers them too
            checked += len(before)
    await stream.close()
    assert checked > 1000  # the writers really were busy while cookies went round
