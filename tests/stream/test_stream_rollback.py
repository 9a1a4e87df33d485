"""Rollback after a crash: mutations streamed while only in memory are undone on resume.

The server runs with a long flush interval so that writes acknowledged with memory durability
stay unpersisted; it is SIGKILLed after a consumer received them.  On restart the engine starts a
new history branch at the persisted seqno of every partition; a consumer that resumes from its
saved positions must be told to roll back exactly on the partitions whose streamed items were
lost, to their persisted seqno, with the rule that decided it, and the server counts it.
"""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.server import start_server
from tests.support.keys import PARTITIONS, keys_in
from tests.support.stream import is_msg
from tests.support.wsclient import Mirror, Position, RawStream, write_docs

pytestmark = pytest.mark.slow

AFFECTED = {1, 4, 6}


async def test_sigkill_with_streamed_memory_only_mutations_rolls_back_exactly_those_partitions(
    tmp_path: Path,
) -> None:
    args = ["--flush-interval-ms", "60000"]
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS, args=args)
    durable = {k: b"durable" for k in keys_in(set(range(PARTITIONS)), 400, prefix="d")}
    write_docs(srv.url, durable, durability="persist")
    persisted = {p["partition"]: p["persisted_seqno"] for p in httpx.get(f"{srv.url}/partitions").json()["partitions"]}

    mirror = Mirror()
    stream = await RawStream.open(srv.url, name="crash-survivor")
    await stream.stream(range(PARTITIONS), mirror)
    volatile = {k: b"only in memory" for k in keys_in(AFFECTED, 90, prefix="m")}
    write_docs(srv.url, volatile)  # acknowledged, not persisted
    await stream.send({"type": "barrier", "cookie": "got-it"})
    await stream.consume(mirror, until=is_msg("barrier", cookie="got-it"))
    assert all(mirror.docs[k][1] == b"only in memory" for k in volatile)  # streamed before the crash
    for p in range(PARTITIONS):
        beyond = mirror.positions[p].seqno > persisted[p]
        assert beyond == (p in AFFECTED)
    saved = {p: Position(**vars(pos)) for p, pos in mirror.positions.items()}

    srv.kill()  # SIGKILL: the memory-only mutations are lost
    srv = start_server(tmp_path / "srv", data_dir=srv.data_dir, partitions=PARTITIONS, args=args)
    try:
        after = {p["partition"]: p for p in httpx.get(f"{srv.url}/partitions").json()["partitions"]}
        assert all(after[p]["high_seqno"] == persisted[p] for p in range(PARTITIONS))

        mirror2 = Mirror(positions={p: Position(**vars(pos)) for p, pos in saved.items()})
        stream = await RawStream.open(srv.url, name="crash-survivor")
        responses = await stream.stream(range(PARTITIONS), mirror2)
        rolled = {p for p, r in responses.items() if r["status"] == "rollback"}
        assert rolled == AFFECTED
        for p in AFFECTED:
            r = responses[p]
            assert r["rollback_seqno"] == persisted[p]
            assert r["reason"] == "diverged"
            assert str(persisted[p]) in r["detail"]
            assert r["failover_log"][0] == [after[p]["uuid"], persisted[p]]  # the new branch
        for p in set(range(PARTITIONS)) - AFFECTED:
            assert responses[p]["status"] == "ok"  # healthy partitions stream on
        healthy_key = keys_in(set(range(PARTITIONS)) - AFFECTED, 1, prefix="h")[0]
        write_docs(srv.url, {healthy_key: b"flows while others roll back"})
        await stream.send({"type": "barrier", "cookie": "healthy"})
        await stream.consume(mirror2, until=is_msg("barrier", cookie="healthy"))
        assert mirror2.docs[healthy_key][1] == b"flows while others roll back"

        # the consumer follows the rollback: newest branch at or below the rollback seqno
        for p in AFFECTED:
            r = responses[p]
            uuid = next(u for u, s in r["failover_log"] if s <= r["rollback_seqno"])
            mirror2.positions[p] = Position(uuid, r["rollback_seqno"], r["rollback_seqno"], r["rollback_seqno"])
        again = await stream.stream(sorted(AFFECTED), mirror2)
        assert {r["status"] for r in again.values()} == {"ok"}
        await stream.send({"type": "barrier", "cookie": "resumed"})
        controls = await stream.consume(mirror2, until=is_msg("barrier", cookie="resumed"))
        seqnos = {int(p): s for p, s in controls[-1]["seqnos"].items()}
        assert {p: seqnos[p] for p in AFFECTED} == {p: persisted[p] for p in AFFECTED}
        assert all(seqnos[p] >= persisted[p] for p in range(PARTITIONS))
        await stream.close()

        metrics = httpx.get(f"{srv.url}/metrics").text
        line = next(x for x in metrics.splitlines() if x.startswith('upr_stream_rollbacks_total{reason="diverged"}'))
        assert float(line.split()[-1]) == len(AFFECTED)

        check = httpx.post(f"{srv.url}/positions/check", json={"positions": [
            {"partition": p, "uuid": s.uuid, "seqno": s.seqno, "snap_start": s.snap_start, "snap_end": s.snap_end}
            for p, s in saved.items()
        ]}).json()["results"]
        assert {x["partition"] for x in check if x["status"] == "rollback"} == AFFECTED
        assert all(x["rule"] == "diverged" for x in check if x["partition"] in AFFECTED)
    finally:
        srv.kill()
    logged = [line for line in srv.log().splitlines() if "told to roll back" in line]
    assert len(logged) == len(AFFECTED) and all("diverged" in line for line in logged)
