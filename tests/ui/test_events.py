"""The event log ring and the state watch: pure, table-driven, no server."""
from __future__ import annotations

import threading

import pytest

from app import events as ev
from app.events_watch import ClusterFacts, Observation, PartitionFacts, StateWatch, cluster_facts, ranges


def _log(n: int, capacity: int = 4) -> ev.EventLog:
    log = ev.EventLog(capacity, clock=lambda: 100.0)
    for i in range(n):
        log.record(ev.EventKind.STATE, f"e{i + 1}")
    return log


@pytest.mark.parametrize(
    ("recorded", "since", "ids", "last_id", "truncated", "reset"),
    [
        (0, 0, [], 0, False, False),
        (3, 0, [1, 2, 3], 3, False, False),
        (3, 2, [3], 3, False, False),
        (3, 3, [], 3, False, False),
        (6, 0, [3, 4, 5, 6], 6, True, False),     # 1 and 2 fell off: the reader is told
        (6, 1, [3, 4, 5, 6], 6, True, False),
        (6, 2, [3, 4, 5, 6], 6, False, False),    # nothing after 2 was lost
        (6, 6, [], 6, False, False),
        (2, 9, [1, 2], 2, False, True),           # since past the newest: a restarted node's new log
    ],
)
def test_since_pages(recorded: int, since: int, ids: list[int], last_id: int, truncated: bool, reset: bool) -> None:
    page = _log(recorded).since(since)
    assert [e.id for e in page.events] == ids
    assert (page.last_id, page.truncated, page.reset) == (last_id, truncated, reset)


def test_ring_is_bounded_and_limit_pages() -> None:
    log = _log(1000, capacity=16)
    assert len(log) == 16 and log.last_id == 1000
    first = log.since(984, limit=5)
    assert [e.id for e in first.events] == [985, 986, 987, 988, 989] and first.last_id == 989
    assert [e.id for e in log.since(first.last_id).events][0] == 990


def test_concurrent_records_get_unique_ordered_ids() -> None:
    log = ev.EventLog(10_000)
    threads = [threading.Thread(target=lambda: [log.record(ev.EventKind.STATE, "x") for _ in range(500)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [e.id for e in log.since(0, limit=10_000).events]
    assert ids == list(range(1, 2001))


def test_hooks_do_nothing_without_a_bound_log_and_record_with_one() -> None:
    class Engine:  # any weak-referenceable object stands for the engine
        pass

    engine = Engine()
    response = type("R", (), {"partition": 3, "rollback_seqno": 0, "reason": "purged",
                              "detail": "start_seqno 5 < purge seqno 9: roll back to 0"})()
    ev.rollback_answered(engine, "c1", "127.0.0.1:5", response)  # no log: nothing, no error
    log = ev.EventLog()
    ev.bind(engine, log)
    ev.rollback_answered(engine, "c1", "127.0.0.1:5", response)
    ev.rebalance(engine, "replica of partition 3 moved", partition=3, node="n2")
    kinds = [(e.kind, e.partition) for e in log.since(0).events]
    assert kinds == [(ev.EventKind.ROLLBACK, 3), (ev.EventKind.REBALANCE, 3)]
    rollback = log.since(0).events[0]
    assert rollback.details["rule"] == "purged" and "start_seqno 5" in rollback.details["detail"]


def _obs(states: dict[int, tuple[str, int]], fault: str | None = None, cluster: ClusterFacts | None = None) -> Observation:
    return Observation("n1", tuple(PartitionFacts(p, s, (b, 10)) for p, (s, b) in sorted(states.items())), fault, cluster)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (_obs({0: ("active", 1)}), _obs({0: ("active", 1)}), []),
        (_obs({0: ("replica", 1), 1: ("replica", 1)}), _obs({0: ("active", 2), 1: ("active", 3)}),
         [(ev.EventKind.PROMOTION, None, "2 partitions (0-1): promoted replica -> active")]),
        (_obs({0: ("active", 1)}), _obs({0: ("dead", 1)}), [(ev.EventKind.STATE, 0, "partition 0: state active -> dead")]),
        (_obs({0: ("active", 1)}), _obs({0: ("active", 2)}), [(ev.EventKind.PROMOTION, 0, "partition 0: new failover entry")]),
        (_obs({0: ("active", 1)}), _obs({0: ("active", 1)}, "disk full"),
         [(ev.EventKind.FLUSH_ERROR, None, "flushing to disk fails on node n1: disk full")]),
        (_obs({0: ("active", 1)}, "disk full"), _obs({0: ("active", 1)}),
         [(ev.EventKind.FLUSH_RECOVERED, None, "flushing to disk works again")]),
        (_obs({}, cluster=ClusterFacts({"a": "up", "b": "up"}, {0: ("a", ("b",)), 1: ("a", ("b",))}, 1)),
         _obs({}, cluster=ClusterFacts({"a": "down", "b": "up"}, {0: ("b", ()), 1: ("b", ())}, 2)),
         [(ev.EventKind.NODE, None, "node a is down"),
          (ev.EventKind.FAILOVER, None, "2 partitions (0-1): failed over from node a (down) to b")]),
        (_obs({}, cluster=ClusterFacts({"a": "up", "b": "up"}, {0: ("a", ("b",))}, 1)),
         _obs({}, cluster=ClusterFacts({"a": "up", "b": "up", "c": "up"}, {0: ("b", ("a",))}, 2)),
         [(ev.EventKind.NODE, None, "node c joined"), (ev.EventKind.TAKEOVER, 0, "partition 0: active moved from node a to b")]),
        (_obs({}, cluster=ClusterFacts({"a": "up"}, {0: (None, ()), 1: (None, ())}, 0)),
         _obs({}, cluster=ClusterFacts({"a": "up"}, {0: ("a", ()), 1: ("a", ())}, 1)),
         [(ev.EventKind.REBALANCE, None, "2 partitions (0-1): active placed on node a")]),
        (_obs({}, cluster=ClusterFacts({"a": "up", "b": "up"}, {0: ("a", ("b",))}, 1)),
         _obs({}, cluster=ClusterFacts({"a": "up", "b": "up"}, {0: ("a", ())}, 2)),
         [(ev.EventKind.REBALANCE, 0, "partition 0: replicas changed (map revision 1 -> 2)")]),
    ],
)
def test_state_watch_finds_changes(before: Observation, after: Observation,
                                   expected: list[tuple[ev.EventKind, int | None, str]]) -> None:
    watch = StateWatch()
    assert watch.observe(before) == []  # the first observation is the baseline
    found = watch.observe(after)
    assert [(f.kind, f.partition) for f in found] == [(k, p) for k, p, _ in expected]
    for f, (_k, _p, text) in zip(found, expected):
        assert f.message.startswith(text)


def test_ranges_and_cluster_facts() -> None:
    assert ranges([5, 0, 1, 2, 9, 10]) == "0-2, 5, 9-10"
    facts = cluster_facts({"nodes": [{"name": "a", "state": "up"}], "map": {"revision": 3, "partitions": [
        {"partition": 0, "active": "a", "replicas": [{"node": "b"}]}]}})
    assert facts == ClusterFacts({"a": "up"}, {0: ("a", ("b",))}, 3)


def test_an_id_from_another_log_reads_this_one_from_the_start() -> None:
    before, after = _log(3), _log(1)  # a node's log before and after a restart: ids restart at 1
    page = after.since(1, log_id=before.log_id)
    assert page.reset and [e.id for e in page.events] == [1]
    assert not after.since(1, log_id=after.log_id).reset


@pytest.mark.parametrize(("prefer", "seconds"), [
    (None, 0.0), ("", 0.0), ("wait=20", 20.0), ("respond-async, wait=5", 5.0), ("WAIT = 3", 3.0),
    ("wait=999", 25.0), ("wait=abc", 0.0), ("nowait=5", 0.0), ("wait=2.5", 2.0),
])
def test_prefer_wait(prefer: str | None, seconds: float) -> None:
    from app.events_api import preferred_wait

    assert preferred_wait(prefer) == seconds
