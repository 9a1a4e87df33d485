"""The ``visibility`` stream option, decided in the pure layer: which parts of a reading a capped
consumer gets, when its stream is visited again, and when its barrier cookies come back.

The rules, as ``engine.protocol.session`` (Visibility) states them:
* a part goes whole or not at all (parts are deduplicated), so a marker never promises a range
  the consumer will not get;
* a stream that held parts back is not visited again before its ceiling reaches that reading's end;
* a cookie comes back once every partition was streamed past it as this consumer sees it.
"""
from __future__ import annotations

from typing import Any

import pytest

from engine.protocol.reading_plan import visible_parts
from engine.protocol.session import Visit
from tests.protocol.test_session import ITEM_FRAME_BYTES, Harness, error


@pytest.mark.parametrize(
    ("rule", "parts", "ceiling", "open_end", "expected"),
    [
        ("no ceiling (memory): every part", [(11, 20), (21, 30)], None, None, 2),
        ("both parts at or below the ceiling", [(11, 20), (21, 30)], 30, None, 2),
        ("the disk part persisted, the memory part above: disk only", [(11, 20), (21, 30)], 20, None, 1),
        ("a part is never cut at the ceiling", [(11, 20), (21, 30)], 25, None, 1),
        ("a single part above the ceiling: nothing", [(11, 20)], 19, None, 0),
        ("a ceiling below the first part: nothing", [(11, 20), (21, 30)], 5, None, 0),
        ("the later part fits only with the earlier: held with it", [(11, 20), (21, 30)], 10, None, 0),
        ("a continuation reaching the open snapshot's end goes", [(16, 20), (21, 40)], 20, 18, 1),
        ("a continuation that would end before the open snapshot's end waits", [(16, 20), (21, 40)], 25, 30, 0),
        ("a whole continuation goes", [(16, 20), (21, 40)], 40, 30, 2),
        ("nothing to read", [], 7, None, 0),
    ],
)
def test_visible_parts_go_whole_up_to_the_ceiling(
    rule: str, parts: list[tuple[int, int]], ceiling: int | None, open_end: int | None, expected: int
) -> None:
    assert visible_parts(parts, ceiling, open_end) == expected


class CappedHarness(Harness):
    """A session whose adapter caps readings at a ceiling, as ``app.stream`` does."""

    def capped_visit(self, p: int, parts: list[tuple[int, int]], ceiling: int) -> list[dict[str, Any]]:
        """One visit reading ``parts`` (each one batch of its end seqno), cut at ``ceiling``."""
        s = self.session
        visit: Visit = s.begin_visit(p)
        out: list[dict[str, Any]] = [{"visit": p, "after": visit.after_seqno}]
        n = visible_parts(parts, ceiling)
        for start, end in parts[:n]:
            out += self.feed([s.snapshot_marker(p, start, end, "disk", 0)])
            out.append({"items": [end], "last": True})
            s.sent(ITEM_FRAME_BYTES)
            out += self.feed(s.items_sent(p, end, True))
        held = parts[-1][1] if n < len(parts) else None
        out += self.feed(s.end_visit(visit, ceiling=ceiling, held_back_to=held))
        return out


def opened(visibility: str = "persisted", partitions: tuple[int, ...] = (0,)) -> CappedHarness:
    h = CappedHarness(partition_count=4)
    h.hello(partitions=list(partitions), visibility=visibility)
    for p in partitions:
        h.open(p)
    return h


def test_hello_accepts_each_visibility_and_defaults_to_memory() -> None:
    for value in ("memory", "persisted", "majority"):
        h = CappedHarness()
        h.hello(visibility=value)
        assert h.session.hello is not None and h.session.hello.visibility == value
    h = CappedHarness()
    h.hello()
    assert h.session.hello is not None and h.session.hello.visibility == "memory"


@pytest.mark.parametrize("bad", ["durable", "", None, 1, ["persisted"], "PERSISTED"])
def test_a_bad_visibility_is_refused_naming_the_field(bad: Any) -> None:
    h = CappedHarness()
    assert h.hello(visibility=bad) == [error("invalid_field", "visibility"), {"close": 1008}]


def test_a_capped_visit_sends_the_parts_below_the_ceiling_and_holds_the_rest() -> None:
    h = opened()
    assert h.capped_visit(0, [(1, 10), (11, 15)], ceiling=10) == [
        {"visit": 0, "after": 0},
        {"type": "snapshot", "partition": 0, "start": 1, "end": 10, "source": "disk", "purge_seqno": 0},
        {"items": [10], "last": True},
        {"type": "cycle_complete", "cycle": 1},  # waiting at its ceiling, the stream is not due
    ]
    stream = h.session.streams[0]
    assert (stream.position, stream.snap_end, stream.ceiling, stream.dirty) == (10, 10, 10, True)


def test_a_stream_waiting_at_its_ceiling_is_not_visited_for_new_writes() -> None:
    h = opened()
    h.capped_visit(0, [(1, 10), (11, 15)], ceiling=10)
    h.session.notify(0)
    assert h.session.next_visit() is None
    h.session.visible_ceiling(0, 12)  # above the position, below the held reading's end
    assert h.session.next_visit() is None
    h.session.visible_ceiling(0, 11)  # ceilings only grow
    assert h.session.streams[0].ceiling == 12
    h.session.visible_ceiling(0, 15)
    assert h.session.next_visit() == 0
    assert h.capped_visit(0, [(11, 17)], ceiling=17)[1]["end"] == 17


def test_without_held_items_a_ceiling_above_the_position_makes_a_dirty_stream_due() -> None:
    h = opened()
    h.capped_visit(0, [(1, 10)], ceiling=10)
    h.session.notify(0)  # a write, not yet persisted
    assert h.session.next_visit() is None
    h.session.visible_ceiling(0, 11)
    assert h.session.next_visit() == 0


def test_a_cookie_waits_until_the_held_reading_is_delivered() -> None:
    h = opened(partitions=(0, 1))
    assert h.client("barrier", cookie="c") == []
    h.capped_visit(0, [(1, 10), (11, 15)], ceiling=10)
    out = h.capped_visit(1, [(1, 4)], ceiling=4)
    assert not [o for o in out if o.get("type") == "barrier"]  # partition 0 still holds 11..15
    h.session.visible_ceiling(0, 15)
    out = h.capped_visit(0, [(11, 16)], ceiling=16)
    assert {"type": "barrier", "cookie": "c", "seqnos": {"0": 16, "1": 4}} in out


def test_a_held_visit_is_completed_by_the_batch_that_reaches_its_end_mid_visit() -> None:
    h = opened(partitions=(0,))
    h.client("barrier", cookie="c")
    h.capped_visit(0, [(1, 10), (11, 15)], ceiling=10)
    h.session.visible_ceiling(0, 15)
    out = h.capped_visit(0, [(11, 15), (16, 20)], ceiling=15)  # holds 16..20 back, reaches 15
    assert {"type": "barrier", "cookie": "c", "seqnos": {"0": 15}} in out


def test_a_cookie_is_answered_at_once_when_a_stream_at_its_ceiling_holds_nothing_back() -> None:
    h = opened()
    h.capped_visit(0, [(1, 10)], ceiling=10)
    h.client("barrier", cookie="c")
    assert h.session.next_visit() == 0  # the cookie draws a visit, ceiling or not
    out = h.capped_visit(0, [], ceiling=10)
    assert {"type": "barrier", "cookie": "c", "seqnos": {"0": 10}} in out


def test_a_cookie_after_a_held_visit_waits_for_its_own_reading() -> None:
    h = opened()
    h.capped_visit(0, [(1, 10), (11, 15)], ceiling=10)
    h.client("barrier", cookie="c")
    assert h.session.next_visit() == 0
    h.capped_visit(0, [(11, 18)], ceiling=10)  # written since: 11..18, none persisted
    assert h.session.pending_cookies == ("c",)
    assert h.session.next_visit() is None
    h.session.visible_ceiling(0, 18)
    out = h.capped_visit(0, [(11, 18)], ceiling=18)
    assert {"type": "barrier", "cookie": "c", "seqnos": {"0": 18}} in out


def test_a_bounded_capped_stream_ends_once_its_end_is_visible() -> None:
    h2 = CappedHarness(partition_count=4)
    h2.hello(partitions=[0], visibility="persisted")
    h2.open(0, end_seqno=12)
    h2.capped_visit(0, [(1, 10), (11, 15)], ceiling=10)
    assert 0 in h2.session.streams
    h2.session.visible_ceiling(0, 15)
    out = h2.capped_visit(0, [(11, 15)], ceiling=15)
    assert {"type": "stream_end", "partition": 0, "reason": "end_seqno_reached", "last_seqno": 15} in out


def test_memory_streams_have_no_ceiling() -> None:
    h = opened(visibility="memory")
    h.visit(0, (1, 10, "disk", [[10]]), (11, 15, "memory", [[15]]))
    stream = h.session.streams[0]
    assert (stream.ceiling, stream.position) == (None, 15)
    h.session.notify(0)
    assert h.session.next_visit() == 0
