"""Exact micro-batches (pure: planning, cuts and rollback checks, no Spark, no server).

The model below is a server partition as the stream sees it: storage keeps each key's latest
version only (deduplicated), and a stream request draws its snapshots when it is served, with
boundaries the driver never sees.  Writes land between planning and reading, so the snapshot that
contains a planned end usually goes on past it.  The driver plans with the real ``next_offset``
(with and without a ``maxOffsetsPerTrigger`` budget), the read keeps what the real cut keeps,
and the next batch starts from the logged end offset, resumed as the real ``resume_position`` says.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.rollback import MustRollBack, StreamPosition, decide
from engine.core.types import FailoverEntry
from spark_connector.cuts import end_position, items_through, resume_position
from spark_connector.meta import local_check
from spark_connector.offsets import PartitionOffset, SourceOffset
from spark_connector.options import OnRollback
from spark_connector.planning import work_items
from spark_connector.progress import ServerMeta, ServerPartition, next_offset

UUID = 77


class Partition:
    """One server partition: the latest version of every key, by seqno."""

    def __init__(self) -> None:
        self.high = 0
        self.persisted = 0
        self.by_key: dict[str, int] = {}

    def write(self, key: str) -> None:
        self.high += 1
        self.by_key[key] = self.high

    def meta(self) -> ServerMeta:
        return ServerMeta(1, {0: ServerPartition(0, self.high, 0, ((UUID, 0),), "active", self.persisted)})

    def serve(self, after: int, end: int, cuts: list[int]) -> list[tuple[str, int]]:
        """A bounded stream from ``after``: every key's latest version above it, in snapshots split
        at ``cuts``; the server ends the stream after the snapshot that contains ``end``."""
        items = sorted((s, k) for k, s in self.by_key.items() if s > after)
        bounds = sorted({c for c in cuts if after < c < self.high} | {self.high})
        stop = next((b for b in bounds if b >= end), self.high)
        return [(k, s) for s, k in items if s <= stop]


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12),
                             st.one_of(st.none(), st.integers(1, 15)),
                             st.lists(st.integers(1, 200), max_size=4), st.integers(0, 12)),
                   min_size=1, max_size=25),
    keys=st.integers(1, 8),
)
def test_batches_are_exact_ranges_with_no_loss_and_no_duplicates(steps, keys):
    part = Partition()
    offset = SourceOffset({0: PartitionOffset()}, 1)
    delivered: list[tuple[str, int]] = []
    counter = 0

    def writes(n: int) -> None:
        nonlocal counter
        for _ in range(n):
            part.write(f"k{counter % keys}")
            counter += 1

    def batch(max_rows: int | None, cuts: list[int]) -> None:
        nonlocal offset
        end = next_offset(offset, part.meta(), check=local_check, policy=OnRollback.FAIL, max_rows=max_rows)
        items = work_items(offset, end)
        rows: list[tuple[str, int]] = []
        for w in items:
            assert w.control is None                        # one branch: never a rollback
            served = part.serve(w.start, w.end, cuts)       # drawn now, after more writes
            rows += served[:items_through([s for _, s in served], w.end)]
        lo, hi = offset.partitions[0].seqno, end.partitions[0].seqno
        assert all(lo < s <= hi for _, s in rows)           # exactly the planned range
        delivered.extend(rows)
        # the logged end resumes: the server's rule accepts it on the same branch
        held = resume_position(end.partitions[0], UUID, part.high)
        decide([FailoverEntry(UUID, 0)], part.high, 0,
               StreamPosition(held.uuid, held.seqno, held.snap_start, held.snap_end))
        offset = SourceOffset.from_json(json.loads(json.dumps(end.to_json())))   # via the offset log

    for before, between, budget, cuts, flushed in steps:
        writes(before)
        part.persisted = min(part.high, part.persisted + flushed)
        end_planned = part.high
        batch(budget, cuts)
        writes(between)
        assert offset.partitions[0].seqno <= end_planned
    for _ in range(part.high + 1):                          # drain: no budget, no writes
        if offset.partitions[0].seqno == part.high:
            break
        batch(None, [])
    seqnos = [s for _, s in delivered]
    assert len(seqnos) == len(set(seqnos))                  # no item twice
    final: dict[str, int] = {}
    for k, s in delivered:
        final[k] = max(final.get(k, 0), s)
    assert final == part.by_key                             # no key's latest version lost


@pytest.mark.parametrize("start, end, expect", [
    (PartitionOffset(UUID, 10, 10, 10), 10, PartitionOffset(UUID, 10, 10, 10)),          # nothing new
    (PartitionOffset(UUID, 10, 10, 10), 25, PartitionOffset(UUID, 25, 11, 25, open_snapshot=True)),
    (PartitionOffset(UUID, 25, 11, 25, open_snapshot=True), 40, PartitionOffset(UUID, 40, 26, 40,
                                                                                 open_snapshot=True)),
    (PartitionOffset(0, 0, 0, 0), 5, PartitionOffset(UUID, 5, 1, 5, open_snapshot=True)),
])
def test_end_position_is_a_partial_snapshot_from_the_batch_start(start, end, expect):
    assert end_position(start, end, UUID) == expect


@pytest.mark.parametrize("log, high, pos, expect", [
    # same branch: the snapshot's end is bounded by the high seqno -> no rollback
    ([(UUID, 0)], 90, PartitionOffset(UUID, 40, 26, 40, open_snapshot=True), None),
    # a newer branch began at 60, above the position: the open snapshot may cross it -> partial
    # snapshot, back to the end of the last whole one (snap_start - 1)
    ([(99, 60), (UUID, 0)], 70, PartitionOffset(UUID, 40, 26, 40, open_snapshot=True), 25),
    # a newer branch began at 30, inside the batch: back to it
    ([(99, 30), (UUID, 0)], 70, PartitionOffset(UUID, 40, 31, 40, open_snapshot=True), 30),
    # a complete position is what it says (unchanged rule)
    ([(99, 60), (UUID, 0)], 70, PartitionOffset(UUID, 40, 40, 40), None),
])
def test_open_snapshot_is_checked_as_a_partial_snapshot(log, high, pos, expect):
    sp = ServerPartition(0, high, 0, tuple(log))
    verdict = local_check(pos, sp)
    assert (verdict.seqno if verdict else None) == expect
    # and the stream request sends the same bound, so the server answers the same
    held = resume_position(pos, log[0][0], high)
    answer = decide([FailoverEntry(u, s) for u, s in log], high, 0,
                    StreamPosition(held.uuid, held.seqno, held.snap_start, held.snap_end))
    assert (answer.seqno if isinstance(answer, MustRollBack) else None) == expect


@pytest.mark.parametrize("start, end, persisted, expect", [
    (PartitionOffset(UUID, 10, 10, 10), 30, 20, PartitionOffset(UUID, 30, 21, 30, open_snapshot=True)),
    (PartitionOffset(UUID, 10, 10, 10), 30, 30, PartitionOffset(UUID, 30, 11, 30, open_snapshot=True)),
    (PartitionOffset(UUID, 10, 10, 10), 30, 5, PartitionOffset(UUID, 30, 11, 30, open_snapshot=True)),
])
def test_a_batch_crossing_the_persisted_seqno_pivots_there(start, end, persisted, expect):
    e = end_position(start, end, UUID, persisted)
    assert e == expect
    items = work_items(SourceOffset({0: start}, 1), SourceOffset({0: e}, 1))
    assert [(w.start, w.end) for w in items] == ([(10, 20), (20, 30)] if persisted == 20 else [(10, 30)])
    # a crash whose new branch begins at the persisted seqno rolls back to it, not further
    crashed = ServerPartition(0, persisted + 3, 0, ((99, persisted), (UUID, 0)))
    assert local_check(e, crashed).seqno == (persisted if persisted == 20 else min(persisted, 10))


def test_open_snapshot_offset_round_trips():
    off = SourceOffset({3: PartitionOffset(UUID, 40, 26, 40, 2, open_snapshot=True)}, 4)
    raw = off.to_json()
    assert raw["p"]["3"]["o"] is True
    assert SourceOffset.from_json(json.loads(json.dumps(raw))) == off
    assert "o" not in SourceOffset({3: PartitionOffset(UUID, 40, 40, 40)}, 4).to_json()["p"]["3"]
