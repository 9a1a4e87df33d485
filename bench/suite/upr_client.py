"""upr read through the ``clients`` library, as most users will: ``Consumer`` and ``async for``.

Same server and writer as :mod:`bench.suite.upr`; only the reader differs, so the gap between the
``upr`` and ``upr-clients`` backfill rows is what the library's per-item events cost (positions,
rollback ring, state) over decoding the frames directly. Measured for backfill only: the library
has no "subscribed" signal to start a latency clock from.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from bench.suite.adapter import Start
from bench.suite.upr import UprSystem


class UprClientSystem(UprSystem):
    name = "upr-clients"
    label = "upr via clients.Consumer"
    stream_module = "bench.suite.upr_client"
    method = {
        "backfill": "clients.Consumer(start='beginning', until_now=True), async for events",
    }
    only = ("backfill",)

    def consumer_conn(self) -> dict[str, Any]:
        return {"http_url": self.url}


async def open_stream(conn: dict[str, Any], start: Start, ident: int) -> AsyncIterator[list[bytes | str]]:
    from clients import Consumer, MemoryStateStore, Mutation

    if start != "beginning":
        raise ValueError("the clients variant is measured for backfill only")
    async with Consumer(conn["http_url"], name=f"bench-clients-{ident}", start="beginning", until_now=True,
                        state=MemoryStateStore()) as consumer:
        yield []
        batch: list[bytes | str] = []
        async for event in consumer:
            if type(event) is Mutation:
                batch.append(event.value)
                if len(batch) >= 1000:
                    yield batch
                    batch = []
        if batch:
            yield batch
