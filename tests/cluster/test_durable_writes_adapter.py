"""``app.cluster.durable.DurableWrites`` without sockets: real ``ServerSession``s fed replica
messages (the stream adapter's hook), a real engine as the active, the map, and writers parked
on the event loop.  Which connection speaks for a copy, what a closed or superseded connection
is worth, and when a write is durable, ambiguous or impossible."""
from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cluster.durable import DurabilityAmbiguous, DurabilityImpossible, DurableWrites, problem_of
from engine.cluster.partition_map import PartitionMap, Placement
from engine.config import EngineConfig
from engine.core.types import Op, PartitionState, WriteOp
from engine.engine import Engine
from engine.protocol.session import REPLICATION_PREFIX
from tests.protocol.test_session import Harness

P = 3  # the partition under test: active on n1, replica on n2


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with Engine.open(EngineConfig(data_dir=tmp_path / "data", partitions=8, flush_interval_ms=2.0)) as engine:
        for p in range(8):
            engine.set_state(p, PartitionState.ACTIVE)
        yield engine


def map_of(*placements: tuple[int, str, tuple[str, ...]], revision: int = 1) -> PartitionMap:
    chosen = {p: Placement(active, replicas) for p, active, replicas in placements}
    return PartitionMap(revision, tuple(chosen.get(p, Placement(None)) for p in range(8)))


def write(engine: Engine, partition: int, n: int = 1) -> int:
    """``n`` writes to ``partition``; the last seqno."""
    keys = [f"k{i}" for i in range(10_000) if engine.partition_of(f"k{i}") == partition][:n]
    return max(engine.write(WriteOp(Op.MUTATION, key, b"v")).seqno for key in keys)


def replica_connection(node: str = "n2", partition: int = P) -> Harness:
    """A replication connection of ``node`` with a stream of ``partition`` open."""
    h = Harness()
    h.hello(name=REPLICATION_PREFIX + node)
    h.open(partition, start=0)
    return h


def ack(durable: DurableWrites, conn: Harness, received: int, persisted: int, partition: int = P) -> None:
    conn.client("seqno_ack", partition=partition, received=received, persisted=persisted)
    durable.acked(conn, conn.session)


def live_nodes(*names: str):
    return lambda node: node in names


async def test_a_majority_write_waits_for_the_replicas_ack(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",))))
    conn = replica_connection()
    durable.acked(conn, conn.session)
    seqno = write(engine, P, 3)
    waiting = asyncio.create_task(durable.wait({P: seqno}, False, 10.0))
    await asyncio.sleep(0.01)
    assert not waiting.done() and durable.waiting == 1
    ack(durable, conn, seqno - 1, 0)
    await asyncio.sleep(0.01)
    assert not waiting.done()
    ack(durable, conn, seqno, 0)
    await asyncio.wait_for(waiting, 5)
    assert durable.waiting == 0 and durable.majority_seqno(P, persisted=False) == seqno


async def test_persist_majority_counts_persisted_figures(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",))))
    conn = replica_connection()
    seqno = write(engine, P)
    engine.flush_now()  # the route waits for the active's own persist first
    ack(durable, conn, seqno, 0)
    with pytest.raises(DurabilityAmbiguous) as info:
        await durable.wait({P: seqno}, True, 0.05)
    assert (info.value.partition, info.value.seqno, info.value.node, info.value.level) == (P, seqno, "n1",
                                                                                          "persist_majority")
    assert "1 of 2 copies" in str(info.value) and "may have been applied" in str(info.value)
    ack(durable, conn, seqno, seqno)
    await durable.wait({P: seqno}, True, 5.0)
    assert durable.majority_seqno(P, persisted=True) == seqno


async def test_without_replicas_a_majority_is_the_active_itself(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ())))
    await durable.wait({P: write(engine, P)}, False, 5.0)


async def test_a_closed_connection_takes_its_acks_with_it(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",))))
    conn = replica_connection()
    seqno = write(engine, P)
    ack(durable, conn, seqno, seqno)
    assert durable.replica_ack("n2", P) is not None
    durable.closed(conn, conn.session)
    assert durable.replica_ack("n2", P) is None
    with pytest.raises(DurabilityAmbiguous):
        await durable.wait({P: seqno}, False, 0.05)


async def test_a_superseded_connection_is_never_heard_again_for_the_partition(engine: Engine) -> None:
    """The replica reconnected (it may have reset since): its old connection's late figures are
    not counted, and its old connection closing does not wipe the new one's."""
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",))))
    seqno = write(engine, P, 2)
    old = replica_connection()
    ack(durable, old, seqno - 1, 0)
    new = replica_connection()
    durable.acked(new, new.session)  # its stream request claims the copy: nothing known yet
    assert durable.replica_ack("n2", P).received == 0
    ack(durable, old, seqno, seqno)  # late, from before a possible reset
    assert durable.replica_ack("n2", P).received == 0
    ack(durable, new, seqno, 0)
    durable.closed(old, old.session)
    assert durable.replica_ack("n2", P).received == seqno
    await durable.wait({P: seqno}, False, 5.0)


async def test_acks_of_consumers_and_of_replicas_not_in_the_map_do_not_count(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",))))
    seqno = write(engine, P)
    stranger = replica_connection("n9")
    ack(durable, stranger, seqno, seqno)
    consumer = Harness()
    consumer.hello(name="indexer")
    consumer.open(P)
    durable.acked(consumer, consumer.session)
    with pytest.raises(DurabilityAmbiguous):
        await durable.wait({P: seqno}, False, 0.05)


async def test_a_new_map_that_moves_the_partition_away_makes_waiters_ambiguous_at_once(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",))))
    seqno = write(engine, P)
    waiting = asyncio.create_task(durable.wait({P: seqno}, False, 30.0))
    await asyncio.sleep(0.01)
    durable.follow_map(map_of((P, "n2", ("n1",)), revision=2))
    with pytest.raises(DurabilityAmbiguous) as info:
        await asyncio.wait_for(waiting, 5)
    assert "no longer active" in info.value.reason and durable.waiting == 0
    with pytest.raises(DurabilityAmbiguous):  # and a write that arrives now is not ours either
        await durable.wait({P: seqno}, False, 5.0)


async def test_fencing_makes_every_waiter_ambiguous(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",)), (1, "n1", ("n2",))))
    waits = [asyncio.create_task(durable.wait({p: write(engine, p)}, False, 30.0)) for p in (P, 1)]
    await asyncio.sleep(0.01)
    durable.retire_all("fenced")
    for waiting in waits:
        with pytest.raises(DurabilityAmbiguous):
            await asyncio.wait_for(waiting, 5)


async def test_a_fenced_batch_leaves_no_exception_unretrieved(engine: Engine) -> None:
    """A batch waits on one future per partition and a fence fails them all at once: the wait
    raises one and takes the others' exceptions, which asyncio would otherwise log as errors."""
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",)), (1, "n1", ("n2",))))
    loop = asyncio.get_running_loop()
    unretrieved: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    try:
        waiting = asyncio.create_task(durable.wait({P: write(engine, P), 1: write(engine, 1)}, False, 30.0))
        await asyncio.sleep(0.01)
        durable.retire_all("fenced")
        with pytest.raises(DurabilityAmbiguous):
            await asyncio.wait_for(waiting, 5)
        del waiting
        gc.collect()  # an unretrieved exception is reported when its future is collected
        assert not unretrieved, unretrieved
    finally:
        loop.set_exception_handler(None)


async def test_a_cancelled_writer_leaves_no_waiter(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",))))
    waiting = asyncio.create_task(durable.wait({P: write(engine, P)}, False, 30.0))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert durable.waiting == 0 and durable.tracker.waiting == 0


@pytest.mark.parametrize(
    ("replicas", "live", "possible"),
    [
        ((), (), True),
        (("n2",), ("n2",), True),
        (("n2",), (), False),  # 1 live of 2: a majority needs 2
        (("n2", "n3"), ("n3",), True),  # 2 of 3
        (("n2", "n3"), (), False),
    ],
)
def test_a_write_is_impossible_when_too_few_copies_are_live(engine: Engine, replicas, live, possible) -> None:
    durable = DurableWrites(engine, "n1", is_live=live_nodes(*live))
    durable.follow_map(map_of((P, "n1", replicas)))
    if possible:
        durable.check_possible(P)
    else:
        with pytest.raises(DurabilityImpossible) as info:
            durable.check_possible(P)
        assert info.value.partition == P and "not applied" in str(info.value)
    durable.check_possible(5)  # not ours: left to the write's own routing (421)


async def test_a_write_already_made_where_no_majority_is_live_is_ambiguous_at_once(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1", is_live=live_nodes())
    durable.follow_map(map_of((P, "n1", ("n2",))))
    with pytest.raises(DurabilityAmbiguous) as info:
        await durable.wait({P: write(engine, P)}, False, 30.0)
    assert "only 1 of its 2 copies are live" in info.value.reason and durable.waiting == 0


def test_the_problem_documents_say_whether_the_write_was_applied_and_where() -> None:
    ambiguous = problem_of(DurabilityAmbiguous(3, 42, "n1", "majority", "1 of 2 copies hold it")).body()
    assert ambiguous["status"] == 504 and ambiguous["type"].endswith("/durability-ambiguous")
    assert {k: ambiguous[k] for k in ("partition", "seqno", "node", "applied", "durability")} == {
        "partition": 3, "seqno": 42, "node": "n1", "applied": "unknown", "durability": "majority"}
    impossible = problem_of(DurabilityImpossible(3, "n1", 1, 2))
    assert impossible.status == 503 and impossible.headers == {"Retry-After": "1"}
    body = impossible.body()
    assert body["type"].endswith("/durability-impossible") and body["applied"] is False and body["partition"] == 3
    assert "partition 3" in body["detail"] and "node n1" in body["detail"]


async def test_majority_advances_are_reported_per_partition(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    advanced: list[int] = []
    durable.on_advance = advanced.append
    durable.follow_map(map_of((P, "n1", ("n2",)), (1, "n1", ("n2",))))
    assert sorted(advanced) == [1, P]
    advanced.clear()
    conn = Harness()
    conn.hello(name=REPLICATION_PREFIX + "n2")
    conn.open(P)
    conn.open(1)
    seqno = write(engine, P)
    ack(durable, conn, seqno, 0)
    assert advanced == [P] and durable.majority_seqno(P, False) == seqno
    ack(durable, conn, seqno, 0)  # nothing moved: nobody woken
    assert advanced == [P]


async def test_several_listeners_hear_each_advance_and_a_removed_one_no_more(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    first: list[int] = []
    second: list[int] = []
    durable.on_advance = first.append
    remove = durable.add_advance_listener(second.append)
    durable.follow_map(map_of((P, "n1", ("n2",))))
    assert first == second == [P]
    conn = Harness()
    conn.hello(name=REPLICATION_PREFIX + "n2")
    conn.open(P)
    remove()
    ack(durable, conn, write(engine, P), 0)
    assert first == [P, P] and second == [P]


async def test_a_batch_refused_for_one_partition_parks_nothing_for_the_others(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    durable.follow_map(map_of((P, "n1", ("n2",))))
    with pytest.raises(DurabilityAmbiguous):
        await durable.wait({P: write(engine, P), 5: 1}, False, 5.0)  # 5 is not ours
    assert durable.waiting == 0 and durable.tracker.waiting == 0
    await durable.wait({}, False, 5.0)  # nothing written: nothing to wait for


async def test_each_ack_counts_once_and_a_stream_opened_later_is_claimed_then(engine: Engine) -> None:
    durable = DurableWrites(engine, "n1")
    advanced: list[int] = []
    durable.on_advance = advanced.append
    durable.follow_map(map_of((P, "n1", ("n2",)), (1, "n1", ("n2",))))
    advanced.clear()
    conn = replica_connection()
    first = write(engine, P)
    ack(durable, conn, first, 0)
    assert advanced == [P]
    conn.open(1)  # a second partition on the same connection, after acks of the first
    later = write(engine, 1)
    ack(durable, conn, later, 0, partition=1)
    assert advanced == [P, 1] and durable.majority_seqno(1, False) == later
    durable.acked(conn, conn.session)  # a message that is not an ack: nothing new
    assert advanced == [P, 1]
    second = write(engine, P)
    ack(durable, conn, second, 0)
    assert advanced == [P, 1, P] and durable.majority_seqno(P, False) == second
