"""The GC policy (``engine.core.gc_policy``) as a table, its adapter, and the untracked queue."""
from __future__ import annotations

import gc

import pytest

from engine import gc_tuning
from engine.core.gc_policy import NEVER, FullCollectionClock, GcPolicy
from engine.core.types import Op, WriteOp
from engine.gc_untrack import untrack

POLICY = GcPolicy(young=2_000, middle=2, full_interval_s=100.0)

# (collections fed in order as (generation, seconds since start), thresholds set after each or None)
CASES = [
    ("young collections before the interval change nothing", [(0, 1.0), (1, 50.0), (0, 99.9)], [None, None, None]),
    ("the first collection after the interval arms a full one", [(0, 100.0)], [(2_000, 2, 0)]),
    ("a generation-1 collection arms it as well", [(1, 150.0)], [(2_000, 2, 0)]),
    ("armed: nothing more until the full collection", [(0, 100.0), (0, 101.0), (1, 102.0)],
     [(2_000, 2, 0), None, None]),
    ("the full collection disarms and restarts the clock",
     [(0, 100.0), (2, 101.0), (0, 200.0), (0, 201.0)], [(2_000, 2, 0), (2_000, 2, NEVER), None, (2_000, 2, 0)]),
    ("a full collection nobody armed (gc.collect()) restarts the clock",
     [(2, 60.0), (0, 100.0), (0, 160.0)], [None, None, (2_000, 2, 0)]),
]


@pytest.mark.parametrize("name,events,expected", CASES, ids=[c[0] for c in CASES])
def test_full_collection_clock(name: str, events: list[tuple[int, float]], expected: list) -> None:
    clock = FullCollectionClock(POLICY, now=0.0)
    assert clock.thresholds() == (2_000, 2, NEVER)
    assert [clock.collected(g, t) for g, t in events] == expected


def test_without_an_interval_cpython_decides_full_collections() -> None:
    clock = FullCollectionClock(GcPolicy(young=5_000, middle=3, full_interval_s=None), now=0.0)
    assert clock.thresholds() == (5_000, 3, 10)
    assert [clock.collected(g, t) for g, t in [(0, 1e6), (1, 2e6), (2, 3e6)]] == [None, None, None]


@pytest.mark.parametrize("kwargs", [{"young": 0}, {"middle": 0}, {"full_interval_s": 0.0}])
def test_refuses_meaningless_thresholds(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        GcPolicy(**kwargs)


def test_apply_sets_the_thresholds_and_hooks_once() -> None:
    before = gc.get_threshold()
    try:
        gc_tuning.apply(GcPolicy(young=3_000, middle=4, full_interval_s=60.0))
        gc_tuning.apply(POLICY)
        assert gc.get_threshold() == (2_000, 2, NEVER)
        assert gc.callbacks.count(gc_tuning._on_collection) == 1  # noqa: SLF001
        assert gc_tuning.current() == POLICY
        gc.collect()  # a full collection goes through the hook without changing anything
        assert gc.get_threshold() == (2_000, 2, NEVER)
    finally:
        gc.set_threshold(*before)


def test_untrack_leaves_the_contents_alive_and_tracked() -> None:
    item = WriteOp(Op.MUTATION, "k", b"v")  # a named tuple: tracked
    holder = untrack([item])
    assert not gc.is_tracked(holder) and gc.is_tracked(item)
    gc.collect()
    assert holder[0] is item


def test_published_queue_vectors_are_untracked(make_engine) -> None:  # noqa: ANN001
    eng = make_engine(partitions=2, flush_interval_ms=60_000.0)
    eng.write_batch([WriteOp(Op.MUTATION, f"k{i}", b"v") for i in range(100)])
    roots = [p.queue.root for p in eng._parts]  # noqa: SLF001
    assert roots and not any(gc.is_tracked(r.vec) for r in roots)
    assert sum(len(list(r.items(0, r.high))) for r in roots) == 100
