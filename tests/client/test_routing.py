"""``Router``: which node serves which partition of a cluster consumer, as tables of
(map and events in, actions out) and a property over random event sequences; no sockets, no clock."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.protocol.client.errors import UsageError
from engine.protocol.client.routing import (
    Close,
    MapFormatError,
    MapView,
    Open,
    Reload,
    Router,
    Unserved,
    revision_in,
)

URLS = {"a": "http://a", "b": "http://b", "c": "http://c"}


def view(revision: int, actives: dict[int, str | None] | list[str | None], urls=URLS) -> MapView:
    if isinstance(actives, list):
        actives = dict(enumerate(actives))
    return MapView(revision, actives, urls)


def opens(actions) -> dict[str, tuple[int, ...]]:
    return {a.node: a.partitions for a in actions if type(a) is Open}


# ------------------------------------------------------------------ parsing GET /cluster
def test_map_view_from_cluster_json() -> None:
    data = {"node": "a", "fenced": False, "orchestrator": "a",
            "nodes": [{"name": "a", "state": "up", "url": "http://a/"},
                      {"name": "b", "state": "down", "url": None},
                      {"name": "c", "state": "down", "url": "http://c"}],
            "map": {"revision": 4, "partitions": [{"partition": 1, "active": "b", "replicas": []},
                                                  {"partition": 0, "active": "a", "replicas": []},
                                                  {"partition": 2, "active": None, "replicas": []}]}}
    v = MapView.from_cluster_json(data)
    assert v.revision == 4
    assert v.actives == {0: "a", 1: "b", 2: None}
    assert v.urls == {"a": "http://a", "b": None, "c": None}  # down nodes have no usable URL
    assert v.url_of(0) == ("a", "http://a") and v.url_of(1) == ("b", None) and v.url_of(2) == (None, None)


@pytest.mark.parametrize("data", [
    {}, {"nodes": []}, {"nodes": [], "map": {"revision": "x", "partitions": []}},
    {"nodes": [], "map": {"revision": 1, "partitions": [{"partition": 1, "active": "a"}]}},
    {"nodes": [], "map": {"revision": -1, "partitions": []}}, [], "nope",
])
def test_map_view_rejects_malformed_answers(data) -> None:
    with pytest.raises(MapFormatError):
        MapView.from_cluster_json(data)


@pytest.mark.parametrize("detail, revision", [
    ("partition 3 is replica here (map revision 7; served by n2)", 7),
    ("not active", None), (None, None), ("", None),
])
def test_revision_in_not_my_partition_detail(detail, revision) -> None:
    assert revision_in(detail) == revision


# ------------------------------------------------------------------ placement
def test_first_map_opens_one_connection_per_active_node() -> None:
    r = Router()
    actions = r.map_loaded(view(1, ["a", "b", "a", "c", "b"]), now=0)
    assert actions == [Open(1, "a", "http://a", (0, 2)), Open(2, "b", "http://b", (1, 4)),
                       Open(3, "c", "http://c", (3,))]
    assert r.partitions == (0, 1, 2, 3, 4) and r.waiting() == () and r.reload_at is None
    assert [r.node_of(p) for p in range(5)] == ["a", "b", "a", "c", "b"]


def test_only_wanted_partitions_are_placed() -> None:
    r = Router([3, 1])
    assert opens(r.map_loaded(view(1, ["a", "b", "a", "c"]), 0)) == {"b": (1,), "c": (3,)}


def test_wanted_partition_out_of_the_maps_range_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="partition 9 out of range"):
        Router([9]).map_loaded(view(1, ["a"]), 0)


def test_unserved_partitions_are_reported_once_and_polled_with_growing_delay() -> None:
    r = Router(initial_delay=0.1, max_delay=0.4)
    actions = r.map_loaded(view(1, ["a", None, "b"], urls={"a": "http://a", "b": None}), 0)
    assert actions == [Open(1, "a", "http://a", (0,)),
                       Unserved((1, 2), "map revision 1: 1: no active node, 2: node b is down"),
                       Reload(0.1)]
    delays = []
    for t in (0.1, 0.31, 0.72, 1.13):  # each read when the last one asked for it
        actions = r.map_loaded(view(1, ["a", None, "b"], urls={"a": "http://a", "b": None}), t)
        assert not any(type(a) is Unserved for a in actions)  # reported when they become unserved
        delays += [a.delay for a in actions if type(a) is Reload]
    assert delays == pytest.approx([0.2, 0.4, 0.4, 0.4])
    actions = r.map_loaded(view(2, ["a", "c", "c"]), 1.5)  # served again
    assert actions == [Open(2, "c", "http://c", (1, 2))] and r.unserved == set() and r.reload_at is None


# ------------------------------------------------------------------ moves
def test_a_moved_partition_reopens_on_its_new_node_and_the_others_keep_streaming() -> None:
    r = Router()
    r.map_loaded(view(1, ["a", "a", "b"]), 0)
    assert r.partition_moved(1, 0, now=1.0, revision=2) == [Reload(0.0)]
    assert r.waiting() == (0,)
    actions = r.map_loaded(view(2, ["b", "a", "b"]), 1.0)
    # b already streams partition 2: partition 0 gets a connection of its own, nobody is closed
    assert actions == [Open(3, "b", "http://b", (0,))]
    assert r.connections[1].partitions == {1} and r.connections[2].partitions == {2}


def test_last_partition_moving_away_closes_its_connection() -> None:
    r = Router()
    r.map_loaded(view(1, ["a", "b"]), 0)
    assert r.partition_moved(1, 0, now=1.0) == [Close(1, "a", ()), Reload(0.0)]
    assert 1 not in r.connections


def test_a_partition_goes_back_to_the_same_node_only_after_a_growing_delay() -> None:
    """The map may lag the node that refused it: retry there, backing off."""
    r = Router(initial_delay=0.1, max_delay=0.4)
    r.map_loaded(view(3, ["a", "b"]), 0)
    assert r.partition_moved(1, 0, now=1.0, revision=3) == [Close(1, "a", ()), Reload(0.0)]
    assert r.map_loaded(view(3, ["a", "b"]), 1.0) == [Reload(pytest.approx(0.1))]
    actions = r.map_loaded(view(3, ["a", "b"]), 1.1)
    assert opens(actions) == {"a": (0,)}
    conn = next(a.conn for a in actions if type(a) is Open)
    r.partition_moved(conn, 0, now=1.2)
    assert r.map_loaded(view(3, ["a", "b"]), 1.2) == [Reload(pytest.approx(0.2))]  # doubled
    assert r.map_loaded(view(4, ["c", "b"]), 1.25) == [Open(conn + 1, "c", "http://c", (0,))]  # elsewhere: now


def test_not_my_partition_naming_a_newer_revision_reads_the_map_until_it_arrives() -> None:
    r = Router(initial_delay=0.1)
    r.map_loaded(view(5, ["a", "b"]), 0)
    r.partition_moved(1, 0, now=1.0, revision=6)
    assert r.seen_revision == 6
    # a node that has not read revision 6 yet answers revision 5: read again, after a delay
    assert r.map_loaded(view(5, ["a", "b"]), 1.0) == [Reload(pytest.approx(0.1))]
    assert r.map_loaded(view(6, ["b", "b"]), 1.1) == [Open(3, "b", "http://b", (0,))]


def test_stale_map_is_ignored() -> None:
    r = Router()
    r.map_loaded(view(7, ["a", "b"]), 0)
    assert r.map_loaded(view(6, ["b", "a"]), 1) == []
    assert r.revision == 7 and r.node_of(0) == "a" and r.node_of(1) == "b"


def test_newer_map_taking_a_partition_away_from_a_live_connection_reopens_its_partitions() -> None:
    r = Router()
    r.map_loaded(view(1, ["a", "a", "b"]), 0)
    actions = r.map_loaded(view(2, ["a", "c", "b"]), 1)
    assert actions == [Close(1, "a", (0, 1)), Open(3, "a", "http://a", (0,)), Open(4, "c", "http://c", (1,))]
    assert r.connections.keys() == {2, 3, 4}


def test_node_url_change_reopens_its_connections() -> None:
    r = Router()
    r.map_loaded(view(1, ["a"]), 0)
    actions = r.map_loaded(view(2, ["a"], urls={"a": "http://a2"}), 1)
    assert actions == [Close(1, "a", (0,)), Open(2, "a", "http://a2", (0,))]


# ------------------------------------------------------------------ connections, map reads
def test_lost_connection_waits_for_the_map_then_follows_it() -> None:
    r = Router(initial_delay=0.1)
    r.map_loaded(view(1, ["a", "b", "a"]), 0)
    assert r.connection_lost(1, now=2.0) == [Close(1, "a", (0, 2)), Reload(0.0)]
    # the map still names a (failover takes a lease expiry): retried there after the delay
    assert r.map_loaded(view(1, ["a", "b", "a"]), 2.0) == [Reload(pytest.approx(0.1))]
    assert r.map_loaded(view(2, ["b", "b", "c"]), 2.05) == [Open(3, "b", "http://b", (0,)),
                                                              Open(4, "c", "http://c", (2,))]
    assert r.connection_lost(1, now=3.0) == []  # already gone


def test_map_read_failures_back_off_and_never_ask_twice() -> None:
    r = Router(initial_delay=0.1, max_delay=0.3)
    assert r.map_failed(0.0) == [Reload(0.1)]
    assert r.map_failed(0.05) == []  # a reload is pending already, earlier than the new one
    assert r.reload_due(0.1) and not r.reload_due(0.09)
    assert r.map_failed(0.1) == [Reload(0.2)]
    assert r.map_failed(0.31) == [Reload(0.3)]
    assert r.map_failed(0.62) == [Reload(0.3)]
    assert opens(r.map_loaded(view(1, ["a"]), 0.93)) == {"a": (0,)}
    assert r.map_failed(1.0) == [Reload(0.1)]  # a good read starts the backoff over


def test_revision_seen_reloads_only_for_newer_revisions() -> None:
    r = Router()
    r.map_loaded(view(3, ["a"]), 0)
    assert r.revision_seen(3, 1) == []
    assert r.revision_seen(4, 1) == [Reload(0.0)]
    assert r.revision_seen(4, 1.1) == []


def test_a_map_without_partitions_yet_is_read_again_later() -> None:
    r = Router([1], initial_delay=0.1)
    assert r.map_loaded(view(0, {}), 0) == [Reload(0.1)]
    assert r.map is None and r.waiting() == (1,)
    assert r.map_loaded(view(0, {}), 0.11) == [Reload(0.2)]
    assert opens(r.map_loaded(view(1, ["a", "b"]), 0.32)) == {"b": (1,)}


def test_finished_partitions_are_never_placed_again() -> None:
    r = Router()
    r.map_loaded(view(1, ["a", "a", "b"]), 0)
    assert r.finished(1, [0]) == []
    assert r.finished(1, [1]) == [Close(1, "a", ())]
    assert r.map_loaded(view(2, ["c", "c", "b"]), 1) == []
    assert r.waiting() == () and r.done == {0, 1}


def test_bad_delays_are_refused() -> None:
    with pytest.raises(UsageError):
        Router(initial_delay=0)
    with pytest.raises(UsageError):
        Router(initial_delay=2, max_delay=1)


# ------------------------------------------------------------------ property
NODES = ["a", "b", "c"]
_event = st.one_of(
    st.tuples(st.just("map"), st.integers(0, 6), st.lists(st.sampled_from(NODES + [None]), min_size=6, max_size=6),
              st.sets(st.sampled_from(NODES))),
    st.tuples(st.just("moved"), st.integers(1, 12), st.integers(0, 5), st.none() | st.integers(0, 8)),
    st.tuples(st.just("lost"), st.integers(1, 12)),
    st.tuples(st.just("seen"), st.integers(0, 8)),
    st.tuples(st.just("failed"),),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_event, max_size=40))
def test_every_partition_is_on_at_most_one_connection_of_its_active_node(events) -> None:
    r = Router()
    live: dict[int, tuple[str, set[int]]] = {}  # the adapter's view, built from actions only
    now = 0.0
    for ev in events:
        now += 0.07
        if ev[0] == "map":
            _, rev, actives, down = ev
            urls = {n: (None if n in down else f"http://{n}") for n in NODES}
            actions = r.map_loaded(MapView(rev, dict(enumerate(actives)), urls), now)
        elif ev[0] == "moved":
            actions = r.partition_moved(ev[1], ev[2], now, ev[3])
        elif ev[0] == "lost":
            actions = r.connection_lost(ev[1], now)
        elif ev[0] == "seen":
            actions = r.revision_seen(ev[1], now)
        else:
            actions = r.map_failed(now)
        for a in actions:
            if type(a) is Open:
                assert a.conn not in live and a.partitions
                assert all(r.map.url_of(p) == (a.node, a.url) for p in a.partitions)
                live[a.conn] = (a.node, set(a.partitions))
            elif type(a) is Close:
                assert a.conn in live
                del live[a.conn]
            elif type(a) is Reload:
                assert a.delay >= 0
        if ev[0] == "moved" and ev[1] in live:
            live[ev[1]][1].discard(ev[2])
        # invariants: no partition on two connections; revision never goes back
        seen: set[int] = set()
        for node, parts in live.values():
            assert not parts & seen
            seen |= parts
        assert set(r.assigned) == seen
        assert r.revision <= r.seen_revision or r.revision == -1
        assert set(r.assigned).isdisjoint(r.unserved)
        # whatever waits, a reload is pending (nothing is forgotten)
        if r.map is not None and r.waiting():
            assert r.reload_at is not None
