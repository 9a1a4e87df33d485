"""``POST /docs/_bulk`` at ``majority`` levels against the real app and engine in-process, with a
real ``DurableWrites`` following a map in which partition ``P`` has a replica: a batch touching
``P`` while that replica is down is refused with 503 ``durability-impossible`` and nothing is
written; while it is up but silent the batch ends 504 ``durability-ambiguous``; both outcomes are
counted by level for ``GET /metrics``."""
from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.cluster.durable import DurableWrites
from app.cluster.metrics import ClusterCollector
from engine.cluster.partition_map import PartitionMap, Placement
from tests.support.asgi import InProcessApp, in_process_app
from tests.support.keys import key_in
from tests.support.problems import problem

PARTITIONS = 8
P = 3


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[InProcessApp, DurableWrites, set[str]]]:
    """The app as node ``n1``, active for every partition; ``P`` has the replica ``n2``, live
    while its name is in the returned set."""
    async with in_process_app(tmp_path / "data", partitions=PARTITIONS) as app:
        live: set[str] = set()
        durable = DurableWrites(app.app.state.runner.engine, "n1", is_live=lambda name: name in live)
        placements = tuple(Placement("n1", ("n2",) if p == P else ()) for p in range(PARTITIONS))
        durable.follow_map(PartitionMap(1, placements))
        def view() -> dict:
            return {"node": "n1", "nodes": [], "map": {"revision": 1, "partitions": []}}

        # the node's cluster half as far as the write routes and the console read it: its durable
        # writes, no handover under way, its view
        app.app.state.cluster = SimpleNamespace(durable=durable, handover=SimpleNamespace(records={}), view=view)
        collector = ClusterCollector(view, durable=durable)
        app.app.state.metrics.attach_cluster(collector)
        try:
            yield app, durable, live
        finally:
            app.app.state.cluster = None


def items(*keys: str) -> list[dict]:
    return [{"op": "set", "key": k, "value": i} for i, k in enumerate(keys)]


async def failures(app: InProcessApp) -> dict[tuple[str, str], float]:
    text = (await app.client.get("/metrics")).text
    return {(s.labels["outcome"], s.labels["level"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "upr_cluster_durable_write_failures_total"}


async def test_a_bulk_batch_touching_a_partition_without_a_live_majority_is_refused_whole(node) -> None:
    app, durable, _live = node
    engine = app.app.state.runner.engine
    before = [engine.high_seqno(p) for p in range(PARTITIONS)]
    batch = items(key_in(1, "a"), key_in(P, "b"), key_in(5, "c"))
    r = await app.client.post("/docs/_bulk", params={"durability": "persist_majority"}, json=batch)
    body = problem(r, 503, "durability-impossible")
    assert body["partition"] == P and body["applied"] is False and (body["live_copies"], body["copies"]) == (1, 2)
    assert r.headers["retry-after"] == "1"
    assert [engine.high_seqno(p) for p in range(PARTITIONS)] == before  # nothing of the batch was written
    # partitions whose copies can form a majority (here: the active alone) are written
    r = await app.client.post("/docs/_bulk", params={"durability": "majority"}, json=items(key_in(1, "a")))
    assert r.status_code == 200 and r.json()["succeeded"] == 1, r.text
    counted = await failures(app)
    assert counted[("impossible", "persist_majority")] == 1 and counted[("impossible", "majority")] == 0


async def test_a_live_but_silent_replica_makes_the_batch_ambiguous_and_it_is_counted(node) -> None:
    app, _durable, live = node
    live.add("n2")
    r = await app.client.post("/docs/_bulk", params={"durability": "majority", "durability_timeout_ms": 50},
                              json=items(key_in(P, "b")))
    assert problem(r, 504, "durability-ambiguous")["partition"] == P
    r = await app.client.put(f"/docs/{key_in(P, 'single')}", params={"durability": "majority",
                                                                    "durability_timeout_ms": 50}, content=b"x")
    problem(r, 504, "durability-ambiguous")
    live.clear()
    r = await app.client.put(f"/docs/{key_in(P, 'single')}", params={"durability": "persist_majority"}, content=b"x")
    problem(r, 503, "durability-impossible")
    assert await failures(app) == {("ambiguous", "majority"): 2, ("ambiguous", "persist_majority"): 0,
                                   ("impossible", "majority"): 0, ("impossible", "persist_majority"): 1}
