"""A consumer finds out once whether its seeds are a cluster, whoever asks first: ``barrier()``
called while the iterating task is still reading the map waits for that read, instead of
finding no cluster yet and opening a single-node connection beside the cluster's (where its
barrier would go and never come back).  No sockets: discovery and opening are stand-ins."""
from __future__ import annotations

import asyncio

from clients import Consumer


async def test_a_second_caller_waits_for_the_discovery_under_way() -> None:
    consumer = Consumer(["http://127.0.0.1:9", "http://127.0.0.1:10"], name="discovery")
    cluster = object()
    opened: list[str] = []
    discoveries: list[str] = []

    async def slow_discover() -> None:  # the map read, slow on a loaded machine
        consumer._probe_cluster = False
        discoveries.append("read")
        await asyncio.sleep(0.2)
        consumer._cluster = cluster  # type: ignore[assignment]

    async def open_single() -> None:
        opened.append("single-node connection")

    consumer._discover = slow_discover  # type: ignore[method-assign]
    consumer._open = open_single  # type: ignore[method-assign]
    first = asyncio.create_task(consumer.connect())  # the iterating task's discovery
    await asyncio.sleep(0.05)
    await consumer.connect()  # barrier() meanwhile
    await first
    await consumer.connect()  # later callers: nothing more to find out
    assert consumer._cluster is cluster and opened == [] and discoveries == ["read"]
