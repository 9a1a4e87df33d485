"""Barrier cookies, as transcripts: a cookie comes back only after every streaming partition
completed a visit that began after the cookie arrived."""
from __future__ import annotations

import pytest

from engine.protocol.barrier import BarrierTracker
from engine.protocol.errors import ProtocolError

# A transcript is a list of steps; each step is (operation, argument, released cookies expected).
#   ("start", p)       stream_started(p)         ("stop", p)     stream_stopped(p)
#   ("cookie", c)      add(c)                    ("begin", "p:v") begin_visit(p), token kept as v
#   ("end", "p:v")     end_visit(p, token v)
# After every step release() is called and must return exactly the listed cookies.
TRANSCRIPTS = {
    "a cookie with no streaming partition comes back at once": [
        ("cookie", "c1", ["c1"]),
    ],
    "a cookie waits for a visit of every streaming partition": [
        ("start", 0, []),
        ("start", 1, []),
        ("cookie", "c1", []),
        ("begin", "0:a", []),
        ("end", "0:a", []),
        ("begin", "1:a", []),
        ("end", "1:a", ["c1"]),
    ],
    "a visit that began before the cookie does not count": [
        ("start", 0, []),
        ("begin", "0:a", []),
        ("cookie", "c1", []),
        ("end", "0:a", []),
        ("begin", "0:b", []),
        ("end", "0:b", ["c1"]),
    ],
    "idle visits count like any other": [
        ("start", 0, []),
        ("start", 5, []),
        ("cookie", "c1", []),
        ("begin", "5:a", []),
        ("end", "5:a", []),
        ("begin", "0:a", []),
        ("end", "0:a", ["c1"]),
    ],
    "cookies come back in arrival order, several at once": [
        ("start", 0, []),
        ("cookie", "c1", []),
        ("cookie", "c2", []),
        ("begin", "0:a", []),
        ("end", "0:a", ["c1", "c2"]),
    ],
    "a later cookie waits for its own later visits": [
        ("start", 0, []),
        ("start", 1, []),
        ("cookie", "c1", []),
        ("begin", "0:a", []),
        ("end", "0:a", []),
        ("cookie", "c2", []),
        ("begin", "1:a", []),
        ("end", "1:a", ["c1"]),
        ("begin", "0:b", []),
        ("end", "0:b", ["c2"]),
    ],
    "a stream that ends counts as done": [
        ("start", 0, []),
        ("start", 1, []),
        ("cookie", "c1", []),
        ("begin", "0:a", []),
        ("end", "0:a", []),
        ("stop", 1, ["c1"]),
    ],
    "a refused stream request counts as done": [
        ("start", 3, []),
        ("cookie", "c1", []),
        ("stop", 3, ["c1"]),
    ],
    "a stream opened after the cookie must be visited too": [
        ("start", 0, []),
        ("cookie", "c1", []),
        ("begin", "0:a", []),
        ("start", 1, []),
        ("end", "0:a", []),
        ("begin", "1:a", []),
        ("end", "1:a", ["c1"]),
    ],
    "end_visit of a stopped partition is ignored": [
        ("start", 0, []),
        ("start", 1, []),
        ("begin", "1:a", []),
        ("stop", 1, []),
        ("cookie", "c1", []),
        ("end", "1:a", []),
        ("begin", "0:a", []),
        ("end", "0:a", ["c1"]),
    ],
    "a released cookie may be reused": [
        ("cookie", "c1", ["c1"]),
        ("cookie", "c1", ["c1"]),
    ],
}


@pytest.mark.parametrize("name", TRANSCRIPTS)
def test_barrier_transcript(name: str) -> None:
    tracker = BarrierTracker()
    tokens: dict[str, int] = {}
    for index, (op, arg, expected) in enumerate(TRANSCRIPTS[name]):
        if op == "start":
            tracker.stream_started(arg)
        elif op == "stop":
            tracker.stream_stopped(arg)
        elif op == "cookie":
            tracker.add(arg)
        elif op == "begin":
            tokens[arg] = tracker.begin_visit(int(arg.split(":")[0]))
        elif op == "end":
            tracker.end_visit(int(arg.split(":")[0]), tokens[arg])
        assert tracker.release() == expected, f"step {index}: {op} {arg}"


def test_duplicate_pending_cookie_is_a_protocol_error_that_keeps_the_connection() -> None:
    tracker = BarrierTracker()
    tracker.stream_started(0)
    tracker.add("c1")
    with pytest.raises(ProtocolError) as info:
        tracker.add("c1")
    assert (info.value.code, info.value.field, info.value.close_code) == ("duplicate_cookie", "cookie", None)
    assert tracker.pending == ("c1",)


def test_pending_cookies_are_bounded() -> None:
    tracker = BarrierTracker(max_pending=2)
    tracker.stream_started(0)
    tracker.add("a")
    tracker.add("b")
    with pytest.raises(ProtocolError) as info:
        tracker.add("c")
    assert info.value.code == "too_many_cookies"


def test_needs_visit_until_a_visit_begins_after_the_newest_cookie() -> None:
    tracker = BarrierTracker()
    tracker.stream_started(0)
    assert not tracker.needs_visit(0)
    tracker.add("c1")
    assert tracker.needs_visit(0)
    token = tracker.begin_visit(0)
    assert not tracker.needs_visit(0)  # the visit in progress counts once it ends
    tracker.add("c2")
    assert tracker.needs_visit(0)  # ...but began before c2
    tracker.end_visit(0, token)
    assert tracker.release() == ["c1"]
    tracker.end_visit(0, tracker.begin_visit(0))
    assert tracker.release() == ["c2"]
    assert not tracker.needs_visit(0)
