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
    served_by_in,
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


@pytest.mark.parametrize("detail, node", [
    ("partition 3 is replica here (map revision 7; served by node n2 at http://127.0.0.1:5)", "n2"),
    ("partition 3 is replica here (map revision 7; served by no node right now)", None),
    ("not active", None), (None, None),
])
def test_served_by_in_not_my_partition_detail(detail, node) -> None:
    assert served_by_in(detail) == node


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


def test_unserved_partitions_are_reported_once_and_polled_every_poll_delay() -> None:
    r = Router(initial_delay=0.1, max_delay=0.4, poll_delay=0.2)
    actions = r.map_loaded(view(1, ["a", None, "b"], urls={"a": "http://a", "b": None}), 0)
    assert actions == [Open(1, "a", "http://a", (0,)),
                       Unserved((1, 2), "map revision 1: 1: no active node, 2: node b is down"),
                       Reload(0.1)]
    delays = []
    for t in (0.1, 0.3, 0.5, 0.7):  # each read when the last one asked for it
        actions = r.map_loaded(view(1, ["a", None, "b"], urls={"a": "http://a", "b": None}), t)
        assert not any(type(a) is Unserved for a in actions)  # reported when they become unserved
        delays += [a.delay for a in actions if type(a) is Reload]
    # a failover may name an active any moment: no doubling past poll_delay
    assert delays == pytest.approx([0.2, 0.2, 0.2, 0.2])
    actions = r.map_loaded(view(2, ["a", "c", "c"]), 0.9)  # served again
    assert actions == [Open(2, "c", "http://c", (1, 2))] and r.unserved == set() and r.reload_at is None


def test_a_long_outage_is_polled_with_the_growing_delay() -> None:
    """Past ``unserved_poll_s`` of a spell without an active the map is read less often."""
    r = Router(initial_delay=0.1, max_delay=1.0, poll_delay=0.2, unserved_poll_s=1.0)
    no_active = view(1, ["a", None])
    r.map_loaded(no_active, 0)
    t, delays = 0.1, []
    while t < 5:
        delays += [a.delay for a in r.map_loaded(no_active, t) if type(a) is Reload]
        t = r.reload_at
    assert delays[:5] == pytest.approx([0.2] * 5) and delays[-3:] == pytest.approx([1.0] * 3)
    # served again, then unserved again: a new spell polls every poll_delay from its start
    r.map_loaded(view(2, ["a", "b"]), t)
    assert [a.delay for a in r.map_loaded(view(3, ["a", None]), t + 1) if type(a) is Reload] == [pytest.approx(0.1)]
    assert [a.delay for a in r.map_loaded(view(3, ["a", None]), t + 1.1) if type(a) is Reload] == [pytest.approx(0.2)]


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


REFUSALS = [
    # desc, the map held, the revision the refusal names, refused (not_my_partition; a node name:
    # the server it names), hold
    ("named active, same revision: not yet", view(3, ["a", "b"]), 3, True, "not yet"),
    ("named active, older revision named: not yet", view(3, ["a", "b"]), 2, True, "not yet"),
    ("named active, no revision named: not yet", view(3, ["a", "b"]), None, True, "not yet"),
    ("the node knows a newer map: back off, read it", view(3, ["a", "b"]), 4, True, "back off"),
    ("state_changed: the node gave it up, back off", view(3, ["a", "b"]), None, False, "back off"),
    ("the node names another server (a handover): back off", view(3, ["a", "b"]), 3, "b", "back off"),
    ("the node names itself as the server: not yet", view(3, ["a", "b"]), 3, "a", "not yet"),
]


@pytest.mark.parametrize("desc,held,named,refused,hold", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_a_refusal_by_the_named_active_is_retried_soon(desc, held, named, refused, hold) -> None:
    """The first hold is the same either way; a "not yet" never grows past ``refusal_delay``."""
    r = Router()
    r.map_loaded(held, 0)
    now, holds = 1.0, []
    for _ in range(4):
        conn = next(iter(c for c, v in r.connections.items() if 0 in v.partitions))
        served_by = refused if isinstance(refused, str) else None  # the server the refusal names
        actions = r.partition_moved(conn, 0, now, named, refused=bool(refused), served_by=served_by)
        [reload] = [a for a in actions if type(a) is Reload]
        holds.append(round(r.holds[0].until - now, 3))
        # a "not yet" keeps the map held: read it again (and retry) when the hold ends
        assert reload.delay == pytest.approx(holds[-1] if hold == "not yet" else 0.0)
        now = r.holds[0].until
        r.map_loaded(held, now)  # the node's newer map (if it named one) is not out yet
    assert holds == ([0.05, 0.1, 0.1, 0.1] if hold == "not yet" else [0.05, 0.1, 0.2, 0.4])


def test_a_node_that_keeps_refusing_is_backed_off_per_revision() -> None:
    """``refusals_per_revision`` quick retries under one map, then the doubling delay; a newer
    map that still names the node starts the count over."""
    r = Router(initial_delay=0.1, max_delay=0.4, refusal_delay=0.05, refusals_per_revision=3)
    r.map_loaded(view(3, ["a", "b"]), 0)
    conn, now, holds = 1, 0.0, []
    for _ in range(6):
        r.partition_moved(conn, 0, now, 3, refused=True)
        holds.append(round(r.holds[0].until - now, 3))
        now = r.holds[0].until
        conn = next(a.conn for a in r.map_loaded(view(3, ["a", "b"]), now) if type(a) is Open)
    assert holds == [0.05, 0.05, 0.05, 0.1, 0.2, 0.4]
    r.partition_moved(conn, 0, now, 4, refused=True)  # the node read revision 4 meanwhile
    conn = next(a.conn for a in r.map_loaded(view(4, ["a", "b"]), now + 0.5) if type(a) is Open)
    r.partition_moved(conn, 0, now + 0.5, 4, refused=True)
    assert r.holds[0].until == pytest.approx(now + 0.55)


def _follow_a_promotion(applied_at: float, r: Router) -> tuple[float, int]:
    """Map revision 2 names b active for partition 0 from time 0, but b applies its promotion at
    ``applied_at``: before that it refuses (``not_my_partition`` naming revision 2).  Returns
    (when the partition streamed from b, refusals)."""
    actions = r.map_loaded(view(2, ["b"]), 0.0)
    refusals = 0
    now = 0.0
    while now < 60:
        opened = [a for a in actions if type(a) is Open]
        if opened and now >= applied_at:
            return now, refusals
        if opened:
            refusals += 1
            actions = r.partition_moved(opened[0].conn, 0, now, 2, refused=True)
            continue
        assert r.reload_at is not None, "nothing pending: the partition would wait forever"
        now = max(now, r.reload_at)
        actions = r.map_loaded(view(2, ["b"]), now)
    raise AssertionError("the partition never streamed from its new active")


@pytest.mark.parametrize("applied_at", [0.0, 0.03, 0.12, 0.25, 0.4, 0.7, 1.2])
def test_a_promotion_applied_late_is_followed_within_a_retry(applied_at) -> None:
    """A node applies its promotions one after the other (the last a few hundred ms after the
    map): its refusals meanwhile are "not yet", retried every ``refusal_delay``, not backed off."""
    opened_at, refusals = _follow_a_promotion(applied_at, Router())
    assert applied_at <= opened_at <= applied_at + 0.1 + 1e-9  # the default refusal_delay
    assert refusals <= 2 + applied_at / 0.1 + 1e-9  # not more often than that


def test_a_node_refusing_for_long_is_dialled_with_the_growing_delay() -> None:
    opened_at, refusals = _follow_a_promotion(30.0, Router())
    # 20 quick retries (2 s), then one dial per max_delay at most
    assert refusals <= 20 + 5 + (30 - 2) / 2.0


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
    st.tuples(st.just("moved"), st.integers(1, 12), st.integers(0, 5), st.none() | st.integers(0, 8), st.booleans()),
    st.tuples(st.just("lost"), st.integers(1, 12)),
    st.tuples(st.just("seen"), st.integers(0, 8)),
    st.tuples(st.just("failed"),),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_event, st.sampled_from([0.0, 0.01, 0.04, 0.07, 0.3])), max_size=40))
def test_every_partition_is_on_at_most_one_connection_of_its_active_node(timed_events) -> None:
    r = Router()
    live: dict[int, tuple[str, set[int]]] = {}  # the adapter's view, built from actions only
    left: dict[int, tuple[str, float]] = {}  # partition: the node it last left, when
    now = 0.0
    for ev, step in timed_events:
        now += step
        if ev[0] == "moved" and ev[1] in live and ev[2] in live[ev[1]][1]:
            left[ev[2]] = (live[ev[1]][0], now)
        elif ev[0] == "lost" and ev[1] in live:
            left.update({p: (live[ev[1]][0], now) for p in live[ev[1]][1]})
        if ev[0] == "map":
            _, rev, actives, down = ev
            urls = {n: (None if n in down else f"http://{n}") for n in NODES}
            actions = r.map_loaded(MapView(rev, dict(enumerate(actives)), urls), now)
        elif ev[0] == "moved":
            actions = r.partition_moved(ev[1], ev[2], now, ev[3], refused=ev[4])
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
                for p in a.partitions:  # never straight back to the node it just left: no busy loop
                    if p in left and left[p][0] == a.node:
                        assert now >= left[p][1] + min(r.initial_delay, r.refusal_delay) - 1e-9
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


# ------------------------------------------------------------------ a node killed: map reads vs dials
def _follow_a_kill(failover_at: float, r: Router) -> tuple[float, int]:
    """Node a dies at 0 (every dial to it is refused at once); the map names it until
    ``failover_at``, then names b.  The consumer reads the map whenever the router asks.
    Returns (when the partition opened on b, dials to a after the kill)."""
    r.map_loaded(view(1, ["a"]), -1.0)
    actions = r.connection_lost(1, now=0.0)
    dials = 0
    now = 0.0
    while now < 60:
        reloads = [a.delay for a in actions if type(a) is Reload]
        for a in actions:
            if type(a) is Open and a.node == "b":
                return now, dials
            if type(a) is Open:
                dials += 1
                actions = r.connection_lost(a.conn, now)  # refused
                break
        else:
            assert reloads or r.reload_at is not None, "nothing pending: the partition would wait forever"
            now = r.reload_at if r.reload_at is not None else now + reloads[0]
            actions = r.map_loaded(view(2, ["b"]) if now >= failover_at else view(1, ["a"]), now)
    raise AssertionError("the partition never reopened on its new active")


@pytest.mark.parametrize("failover_at", [0.3, 1.0, 2.05, 2.3, 2.7, 3.3, 5.0, 9.0])
def test_a_killed_nodes_partitions_open_on_the_new_active_within_a_poll_of_the_failover(failover_at) -> None:
    """The dial to the dead node backs off up to ``max_delay``; the map read does not wait for it
    (a 2 s lease fails the node over 2–3 s after the kill, the hold has grown past 1 s by then)."""
    opened_at, dials = _follow_a_kill(failover_at, Router())
    assert failover_at <= opened_at <= failover_at + 0.2 + 1e-9  # the default poll_delay
    # the dials still back off: 0.05, 0.1, 0.2, ... up to max_delay apart, not one per map read
    assert dials <= 2 + sum(1 for k in range(12) if sum(min(2.0, 0.05 * 2 ** i) for i in range(k)) < failover_at)


@pytest.mark.parametrize("failover_at", [2.05, 2.3, 2.6, 3.1, 4.5])
def test_a_dead_node_listed_down_before_the_failover_delays_its_partitions_by_a_poll_at_most(failover_at) -> None:
    """Between the dead node's lease expiring (2 s) and its partitions' promotion the map names it
    ``down``: its partitions are unserved, and the map is read every ``poll_delay`` meanwhile."""
    r = Router()
    r.map_loaded(view(1, ["a"]), -1.0)
    actions = r.connection_lost(1, now=0.0)
    down = {"a": None, "b": "http://b"}
    now = 0.0
    while now < 60:
        if any(type(a) is Open and a.node == "b" for a in actions):
            break
        for a in actions:
            if type(a) is Open:
                actions = r.connection_lost(a.conn, now)  # refused: a is dead
                break
        else:
            now = r.reload_at
            current = (view(3, ["b"]) if now >= failover_at else view(2, ["a"], urls=down) if now >= 2.0
                       else view(1, ["a"]))
            actions = r.map_loaded(current, now)
    assert failover_at <= now <= failover_at + 0.2 + 1e-9


@pytest.mark.parametrize("kwargs", [{"poll_delay": 0}, {"refusal_delay": 0}, {"refusals_per_revision": -1},
                                    {"unserved_poll_s": -1}])
def test_delays_must_be_positive(kwargs) -> None:
    with pytest.raises(UsageError):
        Router(**kwargs)
