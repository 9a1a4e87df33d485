"""Redis Streams: one stream, AOF with ``appendfsync everysec``.

Writer: pipelined XADD (no MULTI), one round trip per batch; the ack is the pipeline's reply,
i.e. the entries are in memory and in the AOF buffer, fsynced within a second (Redis's own
definition of durable-enough with everysec). Reader: XREAD COUNT 1000 (BLOCK when tailing) from
``0`` (backfill) or ``$`` (tail), with redis-py's asyncio client and the hiredis parser.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from bench.suite.adapter import Doc, Start, System
from bench.suite.install import InstallLog, command_version, ensure_debian_package, ensure_python
from bench.suite.procs import ProcessGroup, free_port, wait_for_port

STREAM = "upr-bench"
FIELD = b"d"


class RedisSystem(System):
    name = "redis"
    label = "Redis Streams"
    stream_module = "bench.peers.redis"
    durability = "AOF appendonly yes, appendfsync everysec (ack = XADD reply; fsync within 1 s)"
    method = {
        "ingest": "pipelined XADD ×1000 (one round trip per batch)",
        "backfill": "XREAD COUNT 1000 from 0",
        "tail": "XREAD BLOCK COUNT 1000 from $",
        "fanout": "one connection per consumer, XREAD BLOCK",
    }

    def __init__(self) -> None:
        self.port = 0
        self._client: Any = None
        self._server = ""

    def prepare(self, log: InstallLog) -> dict[str, str]:
        self._server = ensure_debian_package(log, "redis-server", lambda: shutil.which("redis-server"))
        versions = ensure_python(log, ["redis[hiredis]>=5"], ["redis", "hiredis"])
        return {"server": command_version([self._server, "--version"]), **versions}

    async def start(self, procs: ProcessGroup, workdir: Path) -> None:
        import redis.asyncio as aioredis

        data = workdir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        log = data / "redis.log"
        proc = procs.spawn(
            [self._server, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(data),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no",
             "--protected-mode", "yes", "--logfile", str(log), "--maxclients", "1000"],
            name="redis-server", log=data / "stdout.log",
        )
        wait_for_port(self.port, proc, log)
        self._client = aioredis.Redis(host="127.0.0.1", port=self.port)
        await self._client.ping()

    async def reset(self, *, empty: bool = True) -> None:
        await self._client.delete(STREAM)

    async def writer(self) -> _Writer:
        return _Writer(self._client)

    def consumer_conn(self) -> dict[str, Any]:
        return {"port": self.port}

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class _Writer:
    def __init__(self, client: Any) -> None:
        self._client = client

    async def write(self, docs: Sequence[Doc]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for _key, doc in docs:
            pipe.xadd(STREAM, {FIELD: doc})
        await pipe.execute()

    async def close(self) -> None:
        pass


async def open_stream(conn: dict[str, Any], start: Start, ident: int) -> AsyncIterator[list[bytes | str]]:
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=conn["port"])
    try:
        await client.ping()
        last = b"0-0" if start == "beginning" else b"$"
        block = None if start == "beginning" else 1000
        if start == "now":
            # resolve "$" now, so that writes between READY and the first XREAD are not missed
            info = await client.xinfo_stream(STREAM) if await client.exists(STREAM) else None
            last = info["last-generated-id"] if info else b"0-0"
        yield []
        while True:
            reply = await client.xread({STREAM: last}, count=1000, block=block)
            if not reply:
                if start == "beginning":
                    yield []
                continue
            entries = reply[0][1]
            last = entries[-1][0]
            yield [fields[FIELD] for _id, fields in entries]
    finally:
        await client.aclose()
