"""A consumer that stops reading costs the server bounded memory, and still gets everything.

The consumer backfills, then reads nothing for several seconds while writers push far more data
than the bound through the server.  The server's anonymous memory (RSS minus file-backed pages:
LMDB's map is file-backed and the kernel may keep as much of it resident as it likes) is sampled
with psutil the whole time.  Then the consumer reads again and must end with exactly what the
writers wrote.

Unpersisted writes are memory too, and not the stream's: on a loaded machine (slow fsyncs) the
write queue may hold seconds of writes, up to ``--queue-memory-limit-mb``.  The server runs with a
small limit (writers retry its 429 answers, as real writers do), so the bound measures what the
stalled consumer costs, and a failure names the queue's peak and the cursor drops beside the growth.
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.server import start_server
from tests.support.wsclient import Mirror, RawStream

pytestmark = pytest.mark.slow

PARTITIONS = 1  # one partition: the stalled consumer's first snapshot is the whole backlog
VALUE = b"v" * 1000
STALL_S = 6.0
BOUND = 48 * 1024 * 1024
QUEUE_LIMIT_MB = 8


def anon_rss(proc: psutil.Process) -> int:
    info = proc.memory_info()
    return info.rss - info.shared


def queue_bytes(client: httpx.Client) -> float:
    """Unpersisted bytes in every partition's write queue, from ``/metrics``."""
    text = client.get("/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("upr_partition_queue_bytes"))


async def test_stalled_consumer_costs_bounded_memory_and_catches_up(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS, args=["--queue-memory-limit-mb", str(QUEUE_LIMIT_MB)])
    proc = psutil.Process(srv.pid)
    model: dict[str, bytes] = {}
    written = 0

    def write(prefix: str, n: int) -> None:
        nonlocal written
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            for start in range(0, n, 1000):
                batch = [{"op": "set", "key": f"{prefix}{i}", "value_b64": ""} for i in range(start, start + 1000)]
                import base64
                b64 = base64.b64encode(VALUE).decode()
                for item in batch:
                    item["value_b64"] = b64
                r = client.post("/docs/_bulk", json=batch)
                while r.status_code == 429:  # write queue over its limit: back off until the flusher catches up
                    time.sleep(0.1)
                    r = client.post("/docs/_bulk", json=batch)
                r.raise_for_status()
                for item in batch:
                    model[item["key"]] = VALUE
                written += len(VALUE) * len(batch)

    try:
        write("a", 20_000)
        stream = await RawStream.open(srv.url, name="keeps-up", window=256 * 1024)
        mirror = Mirror()
        await stream.stream(range(PARTITIONS), mirror)
        await stream.send({"type": "barrier", "cookie": "warm"})
        await stream.consume(mirror, until=lambda m: isinstance(m, dict) and m.get("cookie") == "warm")
        baseline = anon_rss(proc)

        samples: list[int] = []
        done = threading.Event()

        queue_peak = 0.0

        def sample() -> None:
            nonlocal queue_peak
            with httpx.Client(base_url=srv.url, timeout=10) as client:
                while not done.is_set():
                    samples.append(anon_rss(proc))
                    queue_peak = max(queue_peak, queue_bytes(client))
                    time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        written_before = written
        writer = asyncio.get_running_loop().run_in_executor(None, write, "b", 150_000)
        while written - written_before < 60 * 2**20:
            await asyncio.sleep(0.05)
        # This consumer asks for a backlog of 80+ MB, then reads nothing (no recv, no ack).
        stalled = await RawStream.open(srv.url, name="stalled", window=256 * 1024, auto_ack=False, max_queue=4)
        await stalled.stream(range(PARTITIONS))
        deadline = time.monotonic() + STALL_S
        # the other consumer keeps up in the meantime
        while time.monotonic() < deadline or not writer.done():
            await stream.send({"type": "barrier", "cookie": f"t{time.monotonic()}"})
            await stream.consume(mirror, until=lambda m: isinstance(m, dict) and m.get("type") == "barrier")
        await writer
        listed = {s["name"]: s for s in httpx.get(f"{srv.url}/streams").json()["streams"]}
        done.set()
        sampler.join()
        growth = max(samples) - baseline
        pushed = written - written_before
        seen = (f"anon RSS grew {growth / 2**20:.1f} MiB while {pushed / 2**20:.0f} MiB flowed; write queue peak "
                f"{queue_peak / 2**20:.1f} MiB; stalled consumer's cursor drops {listed['stalled']['cursor_drops']}")
        print(seen)
        assert pushed > 2 * BOUND
        assert growth < BOUND, seen
        assert listed["stalled"]["partitions"][0]["lag"] > 50_000  # the operator sees it behind
        assert listed["stalled"]["bytes_buffered"] >= 256 * 1024  # its window is full
        assert listed["stalled"]["cursor_drops"] >= 1  # its pinned snapshot was released
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert any(line.startswith("upr_stream_cursor_drops_total") and float(line.split()[-1]) >= 1
                   for line in metrics.splitlines())
        assert "upr_stream_delivery_seconds_bucket" in metrics

        # now the stalled consumer reads (and acks) again and gets everything
        stalled.auto_ack = True
        await stalled.ack()
        late = Mirror()
        await stalled.send({"type": "barrier", "cookie": "wake"})
        await stalled.consume(late, until=lambda m: isinstance(m, dict) and m.get("cookie") == "wake", timeout=120)
        assert {k: v for k, (_, v) in late.docs.items()} == model
        await stalled.close()
        await stream.close()
    finally:
        srv.kill()
