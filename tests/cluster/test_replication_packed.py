"""A replica fed packed passes (hello ``frames: packed``) ends exactly as one fed the same visits as
messages: the engine's history, high seqnos and snapshot marks, and the session's positions."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from app.cluster.replication import ReplicaAcker, ReplicationStreams
from app.stream.cursor import marker_text
from engine.config import EngineConfig
from engine.core.types import FailoverEntry, Item, PartitionState
from engine.engine import Engine
from engine.protocol.client.errors import ProtocolViolation
from engine.protocol.client.incoming import decode_frame
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.position import PartitionPosition
from engine.protocol.client.session import ClientSession, RollbackPolicy
from engine.protocol.frames import encode_binary
from engine.protocol.packed import encode_packed

PARTS = 6
UUID = 77


class _Conn:
    async def send(self, msg: Any) -> None:
        pass


def _replica(path: Path) -> Engine:
    engine = Engine.open(EngineConfig(data_dir=path, partitions=PARTS, flush_interval_ms=2.0))
    for p in range(PARTS):
        engine.set_state(p, PartitionState.REPLICA)
        engine.adopt_failover_log(p, (FailoverEntry(UUID, 0),))
    return engine


def _session(partitions: range) -> ClientSession:
    session = ClientSession(partitions=list(partitions), offsets={p: StreamOffset.beginning() for p in partitions},
                            on_rollback=RollbackPolicy.REPORT)
    for p in partitions:
        session.positions[p] = PartitionPosition(p, StreamOffset.beginning(), ())
        session.request_for(p)
        session.stream_ok(p, (FailoverEntry(UUID, 0),))
    return session


def _takes(seed: int) -> list[list[tuple[int, tuple[int, int, str, int] | None, bytes]]]:
    """Random takes of visits: per visit a marker and one to three batches (the last ``last``),
    keys rewritten and deleted now and then."""
    rng = random.Random(seed)
    high = dict.fromkeys(range(PARTS), 0)
    takes = []
    for _ in range(12):
        sections = []
        for p in rng.sample(range(PARTS), rng.randint(1, PARTS)):
            n = rng.randint(1, 7)
            start, end = high[p] + 1, high[p] + n
            items = [Item(b"k%d-%d" % (p, rng.randint(0, 5)), s, 100 + s, 1, rng.random() < 0.2, b"v%d" % s)
                     for s in range(start, end + 1)]
            items = [i._replace(value=b"") if i.deleted else i for i in items]
            cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(0, 2)))) if n > 1 else []
            bounds = [0, *cuts, n]
            for j, (a, b) in enumerate(zip(bounds, bounds[1:])):
                marker = (start, end, "memory", 0) if j == 0 else None
                sections.append((p, marker, encode_binary(p, items[a:b], b == n)))
            high[p] = end
        takes.append(sections)
    return takes


def _as_messages(sections: list[tuple[int, Any, bytes]]) -> list[tuple[Any, int]]:
    out = []
    for p, marker, frame in sections:
        if marker is not None:
            text = marker_text(p, *marker)
            out.append((decode_frame(text), len(text)))
        out.append((decode_frame(frame), len(frame)))
    return out


async def _feed(engine: Engine, takes: list[Any], packed: bool) -> ClientSession:
    streams = ReplicationStreams(engine, "t", None, None, lambda: 0, packed=packed)  # type: ignore[arg-type]
    acker = ReplicaAcker(engine, 1.0)
    session = _session(range(PARTS))
    for sections in takes:
        if packed:
            data = encode_packed(sections)
            received = [(decode_frame(data), len(data))]
        else:
            received = _as_messages(sections)
        acker.begin_take()
        await streams._process(_Conn(), session, acker, received)  # type: ignore[arg-type]
        acker.end_take()
    if packed:
        assert streams.counts.packed_passes == len(takes)
    return session


def _state(engine: Engine) -> list[Any]:
    out = []
    for p in range(PARTS):
        with engine.snapshot(p, 0) as snap:
            out.append((engine.replica_mark(p), [tuple(i) for i in snap.items()], engine.replica_held(p)[0]))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_packed_passes_leave_the_copy_and_positions_as_messages_do(tmp_path: Path, seed: int) -> None:
    takes = _takes(seed)
    results = []
    for packed in (False, True):
        engine = _replica(tmp_path / f"r-{packed}")
        try:
            session = asyncio.run(_feed(engine, takes, packed))
            results.append((_state(engine), {p: repr(pos) for p, pos in session.positions.items()}))
        finally:
            engine.close()
    assert results[0] == results[1]


def test_a_packed_section_of_a_partition_without_a_stream_is_a_protocol_violation(tmp_path: Path) -> None:
    engine = _replica(tmp_path / "r")
    try:
        streams = ReplicationStreams(engine, "t", None, None, lambda: 0)  # type: ignore[arg-type]
        session = _session(range(2))  # partitions 0 and 1 only
        data = encode_packed([(3, (1, 1, "memory", 0), encode_binary(3, [Item(b"k", 1, 1, 1, False, b"v")], True))])
        with pytest.raises(ProtocolViolation):
            asyncio.run(streams._process(_Conn(), session, ReplicaAcker(engine, 1.0),  # type: ignore[arg-type]
                                         [(decode_frame(data), len(data))]))
        assert engine.high_seqno(3) == 0
    finally:
        engine.close()
