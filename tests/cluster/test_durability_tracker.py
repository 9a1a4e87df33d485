"""Majority durability (engine.cluster.durability): which waiters a sequence of events satisfies."""
from __future__ import annotations

import pytest

from engine.cluster.durability import DurabilityTracker, majority_of


@pytest.mark.parametrize(("copies", "needed"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_majority_of(copies: int, needed: int) -> None:
    assert majority_of(copies) == needed


# events: ("replicas", names) | ("active", received, persisted) | ("ack", node, received, persisted)
@pytest.mark.parametrize(
    ("events", "persist", "durable"),
    [
        ([("active", 10, 0)], False, True),  # one copy: majority is memory
        ([("active", 10, 0)], True, False),  # ... and persist_majority is persist
        ([("active", 10, 10)], True, True),
        ([("replicas", {"n2"}), ("active", 10, 10)], False, False),  # two copies need both
        ([("replicas", {"n2"}), ("active", 10, 0), ("ack", "n2", 10, 0)], False, True),
        ([("replicas", {"n2"}), ("active", 10, 0), ("ack", "n2", 10, 0)], True, False),
        ([("replicas", {"n2"}), ("active", 10, 10), ("ack", "n2", 12, 10)], True, True),
        ([("replicas", {"n2"}), ("active", 10, 10), ("ack", "n2", 9, 9)], False, False),
        ([("replicas", {"n2", "n3"}), ("active", 10, 0), ("ack", "n3", 10, 0)], False, True),
        ([("replicas", {"n2", "n3"}), ("active", 5, 0), ("ack", "n2", 10, 0), ("ack", "n3", 10, 0)], False, True),
        ([("replicas", {"n2", "n3"}), ("active", 5, 0), ("ack", "n2", 10, 0)], False, False),
        ([("replicas", {"n2"}), ("active", 10, 0), ("ack", "n4", 10, 10)], False, False),  # not in the map
        ([("replicas", {"n2"}), ("active", 10, 0), ("ack", "n2", 10, 0), ("start", "n2")], False, False),
        ([("replicas", {"n2"}), ("active", 10, 0), ("ack", "n2", 10, 0), ("replicas", {"n3"})], False, False),
    ],
)
def test_is_durable(events, persist: bool, durable: bool) -> None:
    tracker = DurabilityTracker()
    for event in events:
        if event[0] == "replicas":
            tracker.set_replicas(0, frozenset(event[1]))
        elif event[0] == "active":
            tracker.active_progress(0, event[1], event[2])
        elif event[0] == "start":
            tracker.acks.stream_started(event[1], 0)
        else:
            tracker.acks.acknowledged(event[1], 0, event[2], event[3])
    assert tracker.is_durable(0, 10, persist) is durable
    waiter = tracker.wait(0, 10, persist, deadline=100.0)
    assert (tracker.satisfied() == [waiter]) is durable
    assert tracker.waiting == (0 if durable else 1)


def test_waiters_are_satisfied_by_later_acks_and_expire_otherwise() -> None:
    tracker = DurabilityTracker()
    tracker.set_replicas(1, frozenset({"n2"}))
    tracker.active_progress(1, 20, 20)
    first = tracker.wait(1, 15, False, deadline=5.0)
    second = tracker.wait(1, 20, False, deadline=5.0)
    assert tracker.satisfied() == [] and tracker.expired(4.0) == []
    tracker.acks.acknowledged("n2", 1, 17, 0)
    assert tracker.satisfied() == [first]
    assert tracker.expired(5.0) == [second]  # ambiguous: it sits in the active's history
    assert tracker.waiting == 0 and tracker.satisfied() == []


def test_a_durable_waiter_past_its_deadline_is_satisfied_not_expired() -> None:
    tracker = DurabilityTracker()
    tracker.active_progress(2, 3, 3)
    waiter = tracker.wait(2, 3, True, deadline=1.0)
    assert tracker.expired(9.0) == [] and tracker.satisfied() == [waiter]


def test_cancel_forgets_a_waiter() -> None:
    tracker = DurabilityTracker()
    waiter = tracker.wait(0, 1, False, deadline=1.0)
    tracker.cancel(waiter.token)
    assert tracker.waiting == 0 and tracker.expired(2.0) == []


# events as in test_is_durable; expected: (majority seqno in memory, persisted)
@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], (0, 0)),
        ([("active", 10, 4)], (10, 4)),  # one copy: the active's own figures
        ([("replicas", {"n2"}), ("active", 10, 4)], (0, 0)),  # the replica never acked: holds nothing
        ([("replicas", {"n2"}), ("active", 10, 4), ("ack", "n2", 7, 2)], (7, 2)),  # two copies: the lower
        ([("replicas", {"n2"}), ("active", 10, 4), ("ack", "n2", 12, 9)], (10, 4)),
        ([("replicas", {"n2", "n3"}), ("active", 10, 4), ("ack", "n2", 7, 2)], (7, 2)),  # 2 of 3
        ([("replicas", {"n2", "n3"}), ("active", 10, 4), ("ack", "n2", 7, 2), ("ack", "n3", 9, 6)], (9, 4)),
        ([("replicas", {"n2", "n3"}), ("active", 5, 1), ("ack", "n2", 7, 7), ("ack", "n3", 9, 6)], (7, 6)),
        ([("replicas", {"n2"}), ("active", 10, 4), ("ack", "n4", 10, 10)], (0, 0)),  # not in the map
        ([("replicas", {"n2"}), ("active", 10, 4), ("ack", "n2", 10, 4), ("start", "n2")], (0, 0)),
        ([("replicas", {"n2"}), ("active", 10, 4), ("ack", "n2", 10, 4), ("forget", "n2")], (0, 0)),
        ([("replicas", {"n2"}), ("active", 10, 4), ("ack", "n2", 10, 4), ("replicas", frozenset())], (10, 4)),
    ],
)
def test_majority_seqno(events, expected: tuple[int, int]) -> None:
    tracker = DurabilityTracker()
    for event in events:
        if event[0] == "replicas":
            tracker.set_replicas(0, frozenset(event[1]))
        elif event[0] == "active":
            tracker.active_progress(0, event[1], event[2])
        elif event[0] == "start":
            tracker.acks.stream_started(event[1], 0)
        elif event[0] == "forget":
            tracker.acks.forget_stream(event[1], 0)
        else:
            tracker.acks.acknowledged(event[1], 0, event[2], event[3])
    assert (tracker.majority_seqno(0, False), tracker.majority_seqno(0, True)) == expected
    # the figure agrees with is_durable: that seqno is durable, the next is not
    for persist, seqno in zip((False, True), expected):
        assert seqno == 0 or tracker.is_durable(0, seqno, persist)
        assert not tracker.is_durable(0, seqno + 1, persist)


def test_satisfied_can_look_at_some_partitions_only() -> None:
    tracker = DurabilityTracker()
    for p in (0, 1):
        tracker.set_replicas(p, frozenset({"n2"}))
        tracker.active_progress(p, 10, 10)
    first, second = tracker.wait(0, 5, False, 9.0), tracker.wait(1, 5, True, 9.0)
    tracker.acks.acknowledged("n2", 0, 10, 10)
    tracker.acks.acknowledged("n2", 1, 10, 10)
    assert tracker.satisfied([0]) == [first] and tracker.waiting == 1
    assert tracker.satisfied([0, 7]) == [] and tracker.satisfied() == [second] and tracker.waiting == 0


def test_persist_waiters_use_persisted_figures_and_memory_waiters_received_ones() -> None:
    tracker = DurabilityTracker()
    tracker.set_replicas(0, frozenset({"n2"}))
    tracker.active_progress(0, 10, 10)
    tracker.acks.acknowledged("n2", 0, 10, 4)
    memory, persist, later = tracker.wait(0, 8, False, 9.0), tracker.wait(0, 8, True, 9.0), tracker.wait(0, 4, True, 9.0)
    assert tracker.satisfied() == [memory, later]
    tracker.cancel(persist.token)
    assert tracker.waiting == 0 and tracker.satisfied() == [] and tracker.expired(99.0) == []
