"""Resume, property-based: a consumer that disconnects at arbitrary points (including in the middle
of a snapshot) and resumes with its saved (uuid, seqno, snapshot range) ends with exactly the
server's state, for random schedules of writes, deletes and disconnects (hypothesis).  Also:
deduplication (a key rewritten many times while the consumer lags arrives at its latest version)."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.server import ServerProcess, start_server
from tests.support.wsclient import Mirror, Position, RawStream, write_docs

pytestmark = pytest.mark.slow

PARTITIONS = 4
KEYS = [f"key{i}" for i in range(60)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("upr"), partitions=PARTITIONS)
    yield srv
    srv.kill()


MODEL: dict[str, bytes] = {}  # everything ever written to the module's server

write_step = st.tuples(st.just("write"), st.dictionaries(st.sampled_from(KEYS), st.binary(min_size=0, max_size=20000), max_size=40))
delete_step = st.tuples(st.just("delete"), st.lists(st.sampled_from(KEYS), max_size=10))
cut_step = st.tuples(st.just("disconnect_after"), st.integers(min_value=0, max_value=12))
schedule = st.lists(st.one_of(write_step, delete_step, cut_step), min_size=1, max_size=8)


async def read_some(stream: RawStream, mirror: Mirror, n: int) -> None:
    """Process up to ``n`` messages (or fewer if nothing comes for a moment)."""
    for _ in range(n):
        try:
            await stream.consume(mirror, until=lambda m: True, timeout=0.3)
        except TimeoutError:
            return


async def run_schedule(url: str, steps: list[tuple[str, Any]]) -> None:
    saved: dict[int, Position] = {}
    mirror = Mirror()
    # a fresh consumer mirrors the whole history: start from what it would have persisted
    bundle = True  # alternate per connection: resuming works whether a cut falls in a bundle or not
    stream = await RawStream.open(url, name="resumer", window=64 * 1024, bundle=bundle)
    await stream.stream(range(PARTITIONS), mirror)
    for kind, arg in steps:
        if kind == "write":
            if arg:
                write_docs(url, dict(arg))
                MODEL.update(arg)
        elif kind == "delete":
            present = {k: None for k in arg if k in MODEL}
            if present:
                write_docs(url, present)
                for k in present:
                    MODEL.pop(k)
        else:
            await read_some(stream, mirror, arg)
            stream.ws.transport.abort()  # abrupt (no close handshake): whatever was not processed is lost
            saved = {p: Position(**vars(pos)) for p, pos in mirror.positions.items()}
            docs = dict(mirror.docs)
            mirror = Mirror(docs=docs, positions={p: Position(**vars(pos)) for p, pos in saved.items()})
            bundle = not bundle
            stream = await RawStream.open(url, name="resumer", window=64 * 1024, bundle=bundle)
            responses = await stream.stream(range(PARTITIONS), mirror)
            assert all(r["status"] == "ok" for r in responses.values()), responses
    await stream.send({"type": "barrier", "cookie": "end"})
    await stream.consume(mirror, until=lambda m: isinstance(m, dict) and m.get("cookie") == "end")
    await stream.close()
    assert {k: v for k, (_, v) in mirror.docs.items()} == MODEL


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=schedule)
@example(steps=[("write", {f"key{i}": bytes([i]) * 20000 for i in range(40)}), ("disconnect_after", 3)])
def test_resume_from_any_point_ends_with_the_server_state(server: ServerProcess, steps: list[Any]) -> None:
    asyncio.run(run_schedule(server.url, steps))


async def test_a_key_rewritten_while_the_consumer_lags_arrives_at_its_latest_version(server: ServerProcess) -> None:
    stream = await RawStream.open(server.url, name="lagging", window=4096, auto_ack=False)
    mirror = Mirror()
    await stream.stream(range(PARTITIONS), mirror)
    import base64

    import httpx

    with httpx.Client(base_url=server.url, timeout=30) as client:
        for i in range(0, 2000, 200):  # 2,000 versions of one key while the consumer reads nothing
            batch = [{"op": "set", "key": "hot", "value_b64": base64.b64encode(b"v%d" % (i + j)).decode()}
                     for j in range(200)]
            assert client.post("/docs/_bulk", json=batch).status_code == 200
    write_docs(server.url, {"hot": b"final"})
    MODEL["hot"] = b"final"
    stream.auto_ack = True
    await stream.ack()
    await stream.send({"type": "barrier", "cookie": "caught-up"})
    await stream.consume(mirror, until=lambda m: isinstance(m, dict) and m.get("cookie") == "caught-up")
    await stream.close()
    assert mirror.docs["hot"][1] == b"final"
    deliveries = [s for _, s, k, _ in mirror.log if k == "hot"]
    assert 1 <= len(deliveries) < 20  # deduplicated: nowhere near 2,001 versions
    assert deliveries == sorted(deliveries)
