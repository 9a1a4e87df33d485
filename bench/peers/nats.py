"""NATS JetStream: one stream with file storage.

Writer: ``publish_async`` for every document of a batch, then wait for all PubAcks (the server
acks once the message is written to its file store; it fsyncs on ``sync_interval``, 2 minutes by
default, not per message: the NATS docs, "Syncing data to disk").
Reader: an ordered push consumer (ephemeral, flow-controlled, redelivery-free) with deliver
policy ALL (backfill) or NEW (tail); messages are collected by a callback and handed out in lists.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from bench.suite.adapter import Doc, Start, System
from bench.suite.install import InstallLog, command_version, ensure_debian_package, ensure_python
from bench.suite.procs import ProcessGroup, free_port, wait_for_port

STREAM = "UPRBENCH"
SUBJECT = "upr.bench"


class NatsSystem(System):
    name = "nats"
    label = "NATS JetStream"
    stream_module = "bench.peers.nats"
    durability = ("JetStream file storage, default sync_interval (ack = PubAck once written to the file store; "
                  "fsync within 2 min)")
    method = {
        "ingest": "publish_async ×1000, then wait for the 1000 PubAcks",
        "backfill": "ordered push consumer, deliver all",
        "tail": "ordered push consumer, deliver new",
        "fanout": "one connection and ordered push consumer per consumer",
    }

    def __init__(self) -> None:
        self.port = 0
        self._nc: Any = None
        self._js: Any = None
        self._server = ""

    def prepare(self, log: InstallLog) -> dict[str, str]:
        self._server = ensure_debian_package(log, "nats-server", lambda: shutil.which("nats-server"))
        versions = ensure_python(log, ["nats-py>=2.6"], ["nats"])
        return {"server": command_version([self._server, "--version"]), **versions}

    async def start(self, procs: ProcessGroup, workdir: Path) -> None:
        import nats

        data = workdir / "nats"
        data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        log = data / "nats.log"
        proc = procs.spawn(
            [self._server, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(data / "js"),
             "-l", str(log)],
            name="nats-server", log=data / "stdout.log",
        )
        wait_for_port(self.port, proc, log)
        self._nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        self._js = self._nc.jetstream()

    async def reset(self, *, empty: bool = True) -> None:
        from nats.js.api import StorageType, StreamConfig
        from nats.js.errors import NotFoundError

        try:
            await self._js.delete_stream(STREAM)
        except NotFoundError:
            pass
        await self._js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE))

    async def writer(self) -> _Writer:
        return _Writer(self._js)

    def consumer_conn(self) -> dict[str, Any]:
        return {"port": self.port}

    async def stop(self) -> None:
        if self._nc is not None:
            await self._nc.close()
            self._nc = None


class _Writer:
    def __init__(self, js: Any) -> None:
        self._js = js

    async def write(self, docs: Sequence[Doc]) -> list[int]:
        acked = [0] * len(docs)
        futures = []
        for n, (_key, doc) in enumerate(docs):
            fut = await self._js.publish_async(SUBJECT, doc)
            fut.add_done_callback(lambda _f, n=n: acked.__setitem__(n, time.monotonic_ns()))
            futures.append(fut)
        await asyncio.gather(*futures)  # raises if any publish was refused
        return acked

    async def close(self) -> None:
        pass


async def open_stream(conn: dict[str, Any], start: Start, ident: int) -> AsyncIterator[list[bytes | str]]:
    import nats
    from nats.js.api import DeliverPolicy

    nc = await nats.connect(f"nats://127.0.0.1:{conn['port']}")
    pending: list[bytes | str] = []
    arrived = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        pending.append(msg.data)
        arrived.set()

    try:
        js = nc.jetstream()
        policy = DeliverPolicy.ALL if start == "beginning" else DeliverPolicy.NEW
        await js.subscribe(SUBJECT, cb=on_msg, ordered_consumer=True, deliver_policy=policy,
                           pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
        yield []
        while True:
            try:
                await asyncio.wait_for(arrived.wait(), 1.0)
            except TimeoutError:
                yield []
                continue
            arrived.clear()
            batch = pending.copy()
            pending.clear()
            yield batch
    finally:
        await nc.close()
