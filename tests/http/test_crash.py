"""durability=persist survives SIGKILL: every write acknowledged before the kill is there after restart."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import orjson
import pytest

pytestmark = pytest.mark.slow


async def _writer(url: str, worker: int, acked: list[tuple[str, bytes, int, int]], stop: threading.Event) -> None:
    # a write slower than this on a loaded machine is only one not acknowledged: the writer goes on
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                if n % 4 == 0:   # a bulk batch
                    items = [{"op": "set", "key": f"w{worker}-b{n}-{i}", "value": [worker, n, i]} for i in range(50)]
                    r = await client.post("/docs/_bulk?durability=persist", content=orjson.dumps(items))
                    if r.status_code == 200:
                        for item, res in zip(items, r.json()["results"]):
                            assert res["status"] == 200
                            acked.append((item["key"], orjson.dumps(item["value"]), res["partition"], res["seqno"]))
                else:
                    key, value = f"w{worker}-s{n}", f"value {worker} {n}".encode()
                    r = await client.put(f"/docs/{key}?durability=persist", content=value)
                    if r.status_code == 200:
                        body = r.json()
                        acked.append((key, value, body["partition"], body["seqno"]))
            except httpx.TimeoutException:
                continue  # not acknowledged (yet): nothing promised
            except httpx.HTTPError:
                return  # the server died under us: this write was never acknowledged


def test_persisted_writes_survive_sigkill(upr_server) -> None:  # type: ignore[no-untyped-def]
    srv = upr_server(partitions=4, args=["--flush-interval-ms", "50"])
    acked: list[tuple[str, bytes, int, int]] = []
    stop = threading.Event()

    async def run() -> None:
        await asyncio.gather(*(_writer(srv.url, w, acked, stop) for w in range(8)))

    thread = threading.Thread(target=asyncio.run, args=(run(),))
    thread.start()
    # the kill comes after 1000 acknowledged writes, or after 20 s once there are 200 (a loaded
    # machine acknowledges fewer in that time), and within 120 s whatever the count
    started = time.monotonic()
    while len(acked) < 1000 and time.monotonic() - started < 120:
        if len(acked) >= 200 and time.monotonic() - started >= 20:
            break
        time.sleep(0.05)
    srv.kill()            # SIGKILL while writes are in flight
    stop.set()
    thread.join(timeout=30)
    assert len(acked) >= 200, "too few writes acknowledged to mean anything"

    again = upr_server(partitions=4, data_dir=srv.data_dir)
    with httpx.Client(base_url=again.url, timeout=10) as client:
        parts = {p["partition"]: p for p in client.get("/partitions").json()["partitions"]}
        missing = []
        for key, value, partition, seqno in acked:
            r = client.get(f"/docs/{key}")
            if r.status_code != 200 or r.content != value:
                missing.append(key)
            assert parts[partition]["persisted_seqno"] >= seqno
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged writes lost, e.g. {missing[:5]}"
        # unclean restart opened a new failover branch on every partition
        assert all(len(p["failover_log"]) >= 2 for p in parts.values())


def test_sigterm_is_a_clean_shutdown(upr_server) -> None:  # type: ignore[no-untyped-def]
    srv = upr_server(partitions=2)
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        acked = client.put("/docs/clean", content=b"bye").json()   # memory durability only
        logs = {p["partition"]: p["failover_log"] for p in client.get("/partitions").json()["partitions"]}
    srv.stop()
    again = upr_server(partitions=2, data_dir=srv.data_dir)
    with httpx.Client(base_url=again.url, timeout=10) as client:
        assert client.get("/docs/clean").content == b"bye"            # flushed on the way down
        after = {p["partition"]: p["failover_log"] for p in client.get("/partitions").json()["partitions"]}
        assert after == logs                                             # clean: no new branch
        assert client.get(f"/partitions/{acked['partition']}").json()["high_seqno"] == acked["seqno"]
