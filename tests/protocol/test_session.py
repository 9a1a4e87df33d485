"""ServerSession without sockets: transcripts of what the client sends, what the adapter reports,
and what the session answers.

Outputs are rendered compactly: messages as their JSON objects without null fields and without
the long human texts (``detail``, ``message``) or failover logs; ``Close`` as {"close": code};
lookups as {"lookup": ...}.  ``Harness.client`` answers lookups from ``Harness.infos`` the way the
adapter does, and ``Harness.visit`` plays the stream loop for one partition.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from engine.protocol.messages import (
    Ack,
    Barrier,
    Hello,
    PartitionInfo,
    ProtocolLimits,
    StreamEndReason,
    StreamRequest,
    StreamResponse,
    encode,
    to_json_obj,
)
from engine.protocol.reading_plan import PartPlan, plan_reading
from engine.protocol.session import (
    Close,
    LookupPartitions,
    LookupStream,
    ServerSession,
    SessionState,
)
from engine.core.types import FailoverEntry

A, B = 0xA, 0xB
ITEM_FRAME_BYTES = 100
HIDDEN = {"detail", "message", "failover_log"}


def render(out: Any) -> dict[str, Any]:
    if isinstance(out, Close):
        return {"close": int(out.code)}
    if isinstance(out, LookupPartitions):
        return {"lookup": list(out.partitions)}
    if isinstance(out, LookupStream):
        return {"lookup_stream": out.partition}
    obj = to_json_obj(out)
    if obj["type"] == "failover_logs":
        return {"type": "failover_logs", "partitions": sorted(int(p) for p in obj["partitions"])}
    return {k: v for k, v in obj.items() if v is not None and k not in HIDDEN}


class Harness:
    def __init__(self, partition_count: int = 8, limits: ProtocolLimits | None = None) -> None:
        self.session = ServerSession(node_id="node-1", partition_count=partition_count, limits=limits)
        self.infos = {p: PartitionInfo("active", 100, 0, (FailoverEntry(A, 0),)) for p in range(partition_count)}

    def feed(self, outs: list[Any]) -> list[dict[str, Any]]:
        rendered = []
        for out in outs:
            rendered.append(render(out))
            if not isinstance(out, (Close, LookupPartitions, LookupStream)):
                self.session.sent(len(encode(out)))  # the adapter counts every frame it sends
            if isinstance(out, LookupPartitions):
                rendered += self.feed(self.session.partitions_info({p: self.infos[p] for p in out.partitions}))
            elif isinstance(out, LookupStream):
                rendered += self.feed(self.session.stream_info(out.partition, self.infos[out.partition]))
        return rendered

    def client(self, type: str, **fields: Any) -> list[dict[str, Any]]:
        return self.feed(self.session.receive_text(json.dumps({"type": type, **fields})))

    def raw(self, text: str) -> list[dict[str, Any]]:
        return self.feed(self.session.receive_text(text))

    def hello(self, **fields: Any) -> list[dict[str, Any]]:
        return self.client("hello", **{"name": "t", **fields})

    def open(self, p: int, start: int = 0, uuid: int = A, **fields: Any) -> list[dict[str, Any]]:
        snap = fields.pop("snap", (start, start))
        return self.client(
            "stream_request", partition=p, uuid=uuid, start_seqno=start, snap_start=snap[0], snap_end=snap[1], **fields
        )

    def visit(self, p: int, *parts: tuple[int, int, str, list[list[int]]]) -> list[dict[str, Any]]:
        """Play one visit: each part is (start, end, source, batches of seqnos)."""
        s = self.session
        visit = s.begin_visit(p)
        out: list[dict[str, Any]] = [{"visit": p, "after": visit.after_seqno}]
        for start, end, source, batches in parts:
            if not s.is_open(p):
                break
            out += self.feed([s.snapshot_marker(p, start, end, source, 0)])
            for i, seqnos in enumerate(batches):
                if not s.is_open(p):
                    break
                last = i == len(batches) - 1
                out.append({"items": seqnos, "last": last})
                s.sent(ITEM_FRAME_BYTES)
                out += self.feed(s.items_sent(p, seqnos[-1] if seqnos else None, last))
        out += self.feed(s.end_visit(visit))
        return out


def ok(p: int, **extra: Any) -> dict[str, Any]:
    return {"type": "stream_response", "partition": p, "status": "ok", **extra}


def error(code: str, field: str | None = None, partition: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "error", "code": code}
    if field is not None:
        out["field"] = field
    if partition is not None:
        out["partition"] = partition
    return out


# ====================================================================== handshake


def test_hello_is_answered_with_the_failover_logs_of_the_requested_partitions() -> None:
    h = Harness()
    assert h.hello(partitions=[5, 2]) == [{"lookup": [2, 5]}, {"type": "failover_logs", "partitions": [2, 5]}]
    assert h.session.state is SessionState.STREAMING


def test_hello_without_partitions_means_all() -> None:
    h = Harness(partition_count=4)
    assert h.hello()[-1] == {"type": "failover_logs", "partitions": [0, 1, 2, 3]}


def test_failover_logs_carry_state_seqnos_and_log() -> None:
    h = Harness()
    h.infos[1] = PartitionInfo("replica", 7, 3, (FailoverEntry(B, 5), FailoverEntry(A, 0)))
    outs = h.session.receive_message(Hello("t", partitions=(1,)))
    (answer,) = h.session.partitions_info({1: h.infos[1]})
    assert outs == [LookupPartitions((1,))]
    assert (answer.node_id, answer.partition_count, answer.partitions) == ("node-1", 8, {1: h.infos[1]})


@pytest.mark.parametrize(
    ("name", "first", "expected"),
    [
        ("stream request before hello", {"type": "stream_request", "partition": 0, "uuid": 0, "start_seqno": 0,
                                         "snap_start": 0, "snap_end": 0}, [error("wrong_order", "type"),
                                                                           {"close": 1008}]),
        ("barrier before hello", {"type": "barrier", "cookie": "c"}, [error("wrong_order", "type"),
                                                                      {"close": 1008}]),
        ("ack before hello", {"type": "ack", "bytes": 0}, [error("wrong_order", "type"), {"close": 1008}]),
        ("unknown type", {"type": "subscribe"}, [error("unknown_type", "type"), {"close": 1008}]),
        ("hello with an unknown field", {"type": "hello", "name": "x", "colour": 1},
         [error("unknown_field", "colour"), {"close": 1008}]),
        ("hello for an unsupported protocol version", {"type": "hello", "name": "x", "protocol": 2},
         [error("unsupported_protocol", "protocol"), {"close": 1003}]),
        ("hello naming a partition out of range", {"type": "hello", "name": "x", "partitions": [1, 8]},
         [error("invalid_partition", "partitions", 8), {"close": 1008}]),
        ("hello with a window below the minimum", {"type": "hello", "name": "x", "window_bytes": 10},
         [error("invalid_field", "window_bytes"), {"close": 1008}]),
        ("hello whose name holds a lone surrogate", {"type": "hello", "name": "a\ud800"},
         [error("invalid_field", "name"), {"close": 1008}]),
        ("hello whose name holds a lone low surrogate", {"type": "hello", "name": "\udfff"},
         [error("invalid_field", "name"), {"close": 1008}]),
    ],
)
def test_connection_level_faults_close_with_an_error_naming_the_field(
    name: str, first: dict[str, Any], expected: list[dict[str, Any]]
) -> None:
    h = Harness()
    assert h.raw(json.dumps(first)) == expected
    assert h.session.state is SessionState.CLOSED
    assert h.hello() == []  # a closed session ignores everything


def test_no_hello_in_time_closes_the_connection() -> None:
    h = Harness()
    assert h.feed(h.session.hello_timeout(10)) == [error("hello_timeout", "type"), {"close": 1008}]
    assert h.session.state is SessionState.CLOSED
    assert h.hello() == []


def test_the_hello_timer_does_nothing_once_hello_came() -> None:
    h = Harness()
    h.hello()
    assert h.session.hello_timeout(10) == []
    assert h.session.state is SessionState.STREAMING


def test_a_cookie_that_is_not_unicode_closes_the_connection() -> None:
    h = Harness()
    h.hello()
    assert h.raw('{"type": "barrier", "cookie": "c\\ud800"}') == [error("invalid_field", "cookie"), {"close": 1008}]
    assert h.session.pending_cookies == ()


def test_malformed_json_closes_with_1008() -> None:
    h = Harness()
    h.hello()
    assert h.raw("{oops") == [error("malformed_json"), {"close": 1008}]
    assert h.session.close == Close(1008, "malformed_json")


def test_a_second_hello_closes_the_connection() -> None:
    h = Harness()
    h.hello()
    assert h.hello() == [error("duplicate_hello", "type"), {"close": 1008}]


def test_binary_frames_from_clients_close_with_1003() -> None:
    h = Harness()
    h.hello()
    outs = h.feed(h.session.receive_binary(b"\x00\x01"))
    assert outs == [error("unsupported_data"), {"close": 1003}]


def test_oversized_frames_close_with_1009() -> None:
    h = Harness(limits=ProtocolLimits(max_message_bytes=100))
    assert h.hello(name="x" * 150) == [error("message_too_large"), {"close": 1009}]


def test_close_reason_fits_a_close_frame() -> None:
    h = Harness()
    h.raw(json.dumps({"type": "hello", "name": "x", "é" * 200: 1}))
    assert h.session.close is not None
    assert len(h.session.close.reason.encode()) <= 123


# ====================================================================== stream requests


def test_stream_request_opens_a_stream_at_the_consumer_position() -> None:
    h = Harness()
    h.hello()
    assert h.open(3, start=40, snap=(30, 50)) == [{"lookup_stream": 3}, ok(3)]
    stream = h.session.streams[3]
    assert (stream.position, stream.snap_start, stream.snap_end, stream.end_seqno, stream.uuid) == (40, 30, 50,
                                                                                                   None, A)


@pytest.mark.parametrize(
    ("name", "partition", "expected"),
    [
        ("partition out of range", 8, error("invalid_partition", "partition", 8)),
        ("partition not named in hello", 4, error("partition_not_requested", "partition", 4)),
    ],
)
def test_per_stream_faults_get_an_error_and_keep_the_connection(
    name: str, partition: int, expected: dict[str, Any]
) -> None:
    h = Harness()
    h.hello(partitions=[0, 1])
    assert h.open(partition) == [expected]
    assert h.session.state is SessionState.STREAMING
    assert h.open(1) == [{"lookup_stream": 1}, ok(1)]


def test_duplicate_stream_is_refused_and_the_first_keeps_streaming() -> None:
    h = Harness()
    h.hello()
    h.open(2)
    assert h.open(2) == [error("duplicate_stream", "partition", 2)]
    assert h.session.is_open(2)


def test_a_request_still_being_looked_up_counts_as_open() -> None:
    h = Harness()
    h.hello()
    outs = h.session.receive_text(
        json.dumps({"type": "stream_request", "partition": 2, "uuid": A, "start_seqno": 0, "snap_start": 0,
                    "snap_end": 0})
    )
    assert outs == [LookupStream(2)]
    again = h.session.receive_message(_request(2))
    assert [render(o) for o in again] == [error("duplicate_stream", "partition", 2)]


def _request(p: int, uuid: int = A, start: int = 0, **kw: Any) -> StreamRequest:
    return StreamRequest(p, uuid=uuid, start_seqno=start, snap_start=0, snap_end=0, **kw)


def test_healthy_partitions_proceed_while_others_roll_back() -> None:
    h = Harness()
    # Partition 1 branched at 80 (unclean restart); the consumer streamed 81..100 from memory before.
    h.infos[1] = PartitionInfo("active", 80, 0, (FailoverEntry(B, 80), FailoverEntry(A, 0)))
    h.hello()
    assert h.open(1, start=100, snap=(81, 100)) == [
        {"lookup_stream": 1},
        {"type": "stream_response", "partition": 1, "status": "rollback", "rollback_seqno": 80, "reason": "diverged"},
    ]
    assert h.open(2, start=50) == [{"lookup_stream": 2}, ok(2)]
    assert not h.session.is_open(1) and h.session.is_open(2)
    assert h.session.counters["rollback.diverged"] == 1


def test_rollback_response_names_the_rule_and_carries_the_failover_log() -> None:
    h = Harness()
    h.infos[1] = PartitionInfo("active", 80, 0, (FailoverEntry(B, 80), FailoverEntry(A, 0)))
    h.hello()
    h.session.receive_message(_request(1, uuid=0xDEAD, start=0, strict_uuid=True))
    (response,) = h.session.stream_info(1, h.infos[1])
    assert isinstance(response, StreamResponse)
    assert (response.status.value, response.reason, response.rollback_seqno) == ("rollback", "unknown_uuid", 0)
    assert "not in the failover log" in response.detail
    assert response.failover_log == h.infos[1].log


def test_a_rolled_back_consumer_can_request_again_from_the_rollback_seqno() -> None:
    h = Harness()
    h.infos[1] = PartitionInfo("active", 80, 0, (FailoverEntry(B, 80), FailoverEntry(A, 0)))
    h.hello()
    h.open(1, start=100, snap=(81, 100))
    assert h.open(1, start=80, uuid=A) == [{"lookup_stream": 1}, ok(1)]


def test_wrong_partition_state_is_not_my_partition() -> None:
    h = Harness()
    h.infos[6] = PartitionInfo("replica", 100, 0, (FailoverEntry(A, 0),))
    h.hello()
    assert h.open(6) == [{"lookup_stream": 6}, {"type": "stream_response", "partition": 6,
                                                "status": "not_my_partition"}]


def test_range_error_names_the_field() -> None:
    h = Harness()
    h.hello()
    assert h.open(2, start=10, snap=(20, 30)) == [
        {"lookup_stream": 2},
        {"type": "stream_response", "partition": 2, "status": "range_error", "field": "snap_start"},
    ]
    assert h.session.counters["range_error"] == 1


# ====================================================================== the stream loop


def test_streams_are_visited_in_id_order_and_a_pass_ends_with_cycle_complete() -> None:
    h = Harness()
    h.hello()
    h.open(5, start=90, snap=(90, 90))
    h.open(2)
    s = h.session
    assert s.next_visit() == 2
    assert h.visit(2, (1, 60, "disk", [[1, 7], [60]]), (61, 100, "memory", [[99, 100]])) == [
        {"visit": 2, "after": 0},
        {"type": "snapshot", "partition": 2, "start": 1, "end": 60, "source": "disk", "purge_seqno": 0},
        {"items": [1, 7], "last": False},
        {"items": [60], "last": True},
        {"type": "snapshot", "partition": 2, "start": 61, "end": 100, "source": "memory", "purge_seqno": 0},
        {"items": [99, 100], "last": True},
    ]
    assert s.next_visit() == 5
    assert h.visit(5, (91, 100, "memory", [[95, 98]])) == [
        {"visit": 5, "after": 90},
        {"type": "snapshot", "partition": 5, "start": 91, "end": 100, "source": "memory", "purge_seqno": 0},
        {"items": [95, 98], "last": True},
        {"type": "cycle_complete", "cycle": 1},
    ]
    # After a whole snapshot the position is its end, even if its last seqnos were deduplicated away.
    assert (s.streams[2].position, s.streams[5].position) == (100, 100)
    assert s.next_visit() is None  # nothing new: wait, no busy loop


def test_new_mutations_make_a_stream_due_again() -> None:
    h = Harness()
    h.hello()
    h.open(1)
    h.open(4)
    h.visit(1)
    h.visit(4)
    s = h.session
    s.notify(4)
    s.notify(7)  # no stream on 7: ignored
    assert s.next_visit() == 4
    assert h.visit(4, (101, 103, "memory", [[103]])) == [
        {"visit": 4, "after": 0},
        {"type": "snapshot", "partition": 4, "start": 101, "end": 103, "source": "memory", "purge_seqno": 0},
        {"items": [103], "last": True},
        {"type": "cycle_complete", "cycle": 2},
    ]


def test_a_pass_continues_upwards_and_lower_ids_wait_for_the_next_pass() -> None:
    h = Harness()
    h.hello()
    for p in (1, 3, 6):
        h.open(p)
    s = h.session
    assert h.visit(1) == [{"visit": 1, "after": 0}]
    s.notify(1)  # arrives mid-pass: 1 is visited again in the next pass, after 3 and 6
    assert s.next_visit() == 3
    h.visit(3)
    assert s.next_visit() == 6
    assert h.visit(6)[-1] == {"type": "cycle_complete", "cycle": 1}
    assert s.next_visit() == 1


@pytest.mark.parametrize(
    ("name", "setup", "limit", "expected"),
    [
        ("every new stream is due, in id order", [], 10, [1, 3, 5, 6]),
        ("the limit cuts the pass; the rest comes next", [], 2, [1, 3]),
        ("a visit in progress is not begun twice; the pass goes on above it", ["begin 3"], 10, [5, 6]),
        ("the pass goes on upwards from the last visit", ["visit 1", "visit 3", "notify 1"], 10, [5, 6]),
        ("then the next pass starts from the lowest due id", ["visit 1", "visit 3", "visit 5", "visit 6",
                                                              "notify 6", "notify 3"], 10, [3, 6]),
        ("nothing due: nothing begun", ["visit 1", "visit 3", "visit 5", "visit 6"], 10, []),
        ("a pending cookie makes idle streams due", ["visit 1", "visit 3", "visit 5", "visit 6", "cookie"], 10,
         [1, 3, 5, 6]),
        ("a full window begins nothing", ["fill window"], 10, []),
        ("no limit, no visit", [], 0, []),
    ],
)
def test_begin_visits_begins_the_due_streams_of_the_pass_together(
    name: str, setup: list[str], limit: int, expected: list[int]
) -> None:
    h = _after(setup)
    visits = h.session.begin_visits(limit)
    assert [v.partition for v in visits] == expected
    assert all(h.session.streams[v.partition].visiting == v.token for v in visits)  # each one begun
    assert expected == _one_by_one(_after(setup), limit)  # the same as next_visit, one call each


def _after(setup: list[str]) -> Harness:
    """A session streaming partitions 1, 3, 5 and 6 (window 4096) after the ``setup`` steps."""
    h = Harness()
    h.hello(window_bytes=4096)
    for p in (1, 3, 5, 6):
        h.open(p)
    s = h.session
    for step in setup:
        verb, _, arg = step.partition(" ")
        if verb == "visit":
            h.visit(int(arg))
        elif verb == "begin":
            s.begin_visit(int(arg))
        elif verb == "notify":
            s.notify(int(arg))
        elif verb == "cookie":
            h.client("barrier", cookie="c")
        else:  # fill window
            s.sent(4096)
    return h


def _one_by_one(h: Harness, limit: int) -> list[int]:
    """What ``next_visit`` + ``begin_visit`` give, one call each, for the rest of the pass."""
    out: list[int] = []
    s = h.session
    while len(out) < limit:
        p = s.next_visit()
        if p is None or (out and p < out[-1]):
            break
        s.begin_visit(p)
        out.append(p)
    return out


def test_mutations_during_a_visit_make_the_stream_due_again() -> None:
    h = Harness()
    h.hello()
    h.open(2)
    s = h.session
    visit = s.begin_visit(2)
    s.notify(2)
    assert s.next_visit() is None  # being visited
    assert [render(o) for o in s.end_visit(visit)] == [{"type": "cycle_complete", "cycle": 1}]
    assert s.next_visit() == 2


def test_bounded_stream_ends_once_a_complete_snapshot_reaches_the_end_seqno() -> None:
    h = Harness()
    h.hello()
    assert h.open(3, end_seqno=50) == [{"lookup_stream": 3}, ok(3, end_seqno=50)]
    assert h.visit(3, (1, 60, "disk", [[10, 40], [60]]), (61, 100, "memory", [[100]])) == [
        {"visit": 3, "after": 0},
        {"type": "snapshot", "partition": 3, "start": 1, "end": 60, "source": "disk", "purge_seqno": 0},
        {"items": [10, 40], "last": False},
        {"items": [60], "last": True},
        {"type": "stream_end", "partition": 3, "reason": "end_seqno_reached", "last_seqno": 60},
        {"type": "cycle_complete", "cycle": 1},
    ]
    assert not h.session.is_open(3)
    assert h.session.next_visit() is None


def test_to_now_ends_at_the_high_seqno_at_request_time() -> None:
    h = Harness()
    h.hello()
    assert h.open(3, to_now=True) == [{"lookup_stream": 3}, ok(3, end_seqno=100)]
    out = h.visit(3, (1, 100, "disk", [[100]]))
    assert {"type": "stream_end", "partition": 3, "reason": "end_seqno_reached", "last_seqno": 100} in out


def test_to_now_at_the_high_seqno_ends_at_once() -> None:
    h = Harness()
    h.hello()
    assert h.open(3, start=100, snap=(100, 100), to_now=True) == [
        {"lookup_stream": 3},
        ok(3, end_seqno=100),
        {"type": "stream_end", "partition": 3, "reason": "end_seqno_reached", "last_seqno": 100},
    ]


def test_close_stream_ends_it_and_later_batches_are_ignored() -> None:
    h = Harness()
    h.hello()
    h.open(2)
    s = h.session
    visit = s.begin_visit(2)
    s.snapshot_marker(2, 1, 100, "disk", 0)
    s.items_sent(2, 10, False)
    assert h.client("close_stream", partition=2) == [
        {"type": "stream_end", "partition": 2, "reason": "closed", "last_seqno": 10}
    ]
    assert s.items_sent(2, 20, True) == []
    assert [render(o) for o in s.end_visit(visit)] == [{"type": "cycle_complete", "cycle": 1}]
    assert h.client("close_stream", partition=2) == [error("stream_not_open", "partition", 2)]


@pytest.mark.parametrize(
    ("expected_state", "new_state", "ends"),
    [
        ("active", "replica", True),
        ("active", "pending", True),
        ("active", "dead", True),
        ("active", "active", False),  # a write notification, or a change that came back
        ("replica", "active", True),  # a promotion ends a replica stream too
        ("replica", "replica", False),
    ],
)
def test_a_state_change_ends_the_stream_at_once_even_mid_snapshot(
    expected_state: str, new_state: str, ends: bool
) -> None:
    h = Harness()
    h.infos[2] = PartitionInfo(expected_state, 100, 0, (FailoverEntry(A, 0),))
    h.hello()
    h.open(2, expected_state=expected_state)
    s = h.session
    visit = s.begin_visit(2)
    s.snapshot_marker(2, 1, 100, "disk", 0)
    s.items_sent(2, 10, False)  # mid-snapshot
    out = h.feed(s.state_changed(2, new_state))
    if ends:
        assert out == [{"type": "stream_end", "partition": 2, "reason": "state_changed", "last_seqno": 10}]
        assert not s.is_open(2)
        assert s.items_sent(2, 20, True) == []  # the rest of the snapshot is not sent
    else:
        assert out == [] and s.is_open(2)
    s.end_visit(visit)
    assert h.feed(s.state_changed(5, "replica")) == []  # no stream on that partition


def test_end_stream_reports_the_reason_and_position() -> None:
    h = Harness()
    h.hello()
    h.open(2, start=30, snap=(30, 30))
    assert h.feed(h.session.end_stream(2, StreamEndReason.TOO_SLOW)) == [
        {"type": "stream_end", "partition": 2, "reason": "too_slow", "last_seqno": 30}
    ]
    assert h.feed(h.session.end_stream(2, StreamEndReason.STATE_CHANGED)) == []


def test_shutdown_ends_every_stream_and_closes_with_1001() -> None:
    h = Harness()
    h.hello()
    h.open(1)
    h.open(3)
    assert h.feed(h.session.shutdown()) == [
        {"type": "stream_end", "partition": 1, "reason": "shutting_down", "last_seqno": 0},
        {"type": "stream_end", "partition": 3, "reason": "shutting_down", "last_seqno": 0},
        {"close": 1001},
    ]
    assert h.session.next_visit() is None


# ====================================================================== barriers


def test_barrier_returns_after_every_stream_was_visited_with_the_position_vector() -> None:
    h = Harness()
    h.hello()
    h.open(1)
    h.open(4)
    h.visit(1, (1, 100, "disk", [[100]]))
    h.visit(4, (1, 100, "disk", [[100]]))
    s = h.session
    assert h.client("barrier", cookie="cut") == []
    assert s.next_visit() == 1  # idle streams are due: the cookie needs a visit of each
    assert h.visit(1) == [{"visit": 1, "after": 100}]
    s.notify(4)
    assert s.next_visit() == 4
    assert h.visit(4, (101, 105, "memory", [[105]])) == [
        {"visit": 4, "after": 100},
        {"type": "snapshot", "partition": 4, "start": 101, "end": 105, "source": "memory", "purge_seqno": 0},
        {"items": [105], "last": True},
        {"type": "barrier", "cookie": "cut", "seqnos": {"1": 100, "4": 105}},
        {"type": "cycle_complete", "cycle": 2},
    ]
    assert s.pending_cookies == ()


def test_barrier_is_not_released_by_a_visit_that_began_before_it() -> None:
    h = Harness()
    h.hello()
    h.open(1)
    s = h.session
    visit = s.begin_visit(1)
    assert h.client("barrier", cookie="c") == []
    assert h.feed(s.end_visit(visit)) == [{"type": "cycle_complete", "cycle": 1}]
    assert s.next_visit() == 1
    assert h.visit(1) == [{"visit": 1, "after": 0}, {"type": "barrier", "cookie": "c", "seqnos": {"1": 0}},
                          {"type": "cycle_complete", "cycle": 2}]


def test_barrier_with_nothing_to_stream_comes_back_at_once() -> None:
    h = Harness()
    h.hello()
    assert h.client("barrier", cookie="c") == [{"type": "barrier", "cookie": "c", "seqnos": {}}]


def test_barrier_waits_for_a_stream_request_still_being_answered() -> None:
    h = Harness()
    h.hello()
    s = h.session
    assert s.receive_message(_request(2)) == [LookupStream(2)]
    assert s.receive_message(Barrier("c")) == []
    h.feed(s.stream_info(2, h.infos[2]))
    out = h.visit(2)
    assert {"type": "barrier", "cookie": "c", "seqnos": {"2": 0}} in out


def test_refused_and_ended_streams_release_pending_barriers() -> None:
    h = Harness()
    h.infos[2] = PartitionInfo("replica", 0, 0, (FailoverEntry(A, 0),))
    h.hello()
    s = h.session
    h.open(1)
    assert s.receive_message(_request(2)) == [LookupStream(2)]
    assert s.receive_message(Barrier("c")) == []
    assert [render(o) for o in s.stream_info(2, h.infos[2])] == [
        {"type": "stream_response", "partition": 2, "status": "not_my_partition"}
    ]
    assert h.client("close_stream", partition=1) == [
        {"type": "stream_end", "partition": 1, "reason": "closed", "last_seqno": 0},
        {"type": "barrier", "cookie": "c", "seqnos": {"1": 0}},
    ]


def test_duplicate_pending_cookie_gets_an_error_without_closing() -> None:
    h = Harness()
    h.hello()
    h.open(1)
    h.client("barrier", cookie="c")
    assert h.client("barrier", cookie="c") == [error("duplicate_cookie", "cookie")]
    assert h.session.state is SessionState.STREAMING
    assert h.session.pending_cookies == ("c",)


def test_too_many_pending_cookies_are_refused() -> None:
    h = Harness(limits=ProtocolLimits(max_pending_cookies=1))
    h.hello()
    h.open(1)
    h.client("barrier", cookie="a")
    assert h.client("barrier", cookie="b") == [error("too_many_cookies", "cookie")]


# ====================================================================== flow control


def test_a_full_window_stops_visits_until_the_client_acks() -> None:
    h = Harness()
    h.hello(window_bytes=4096)
    h.open(1)
    s = h.session
    assert s.flow is not None
    s.sent(4000 - s.flow.in_flight)  # failover_logs and stream_response were counted already
    assert s.can_send and s.next_visit() == 1
    s.sent(500)
    assert not s.can_send and s.next_visit() is None
    assert h.client("ack", bytes=1000) == []
    assert s.flow.in_flight == 3500
    assert s.next_visit() == 1


def test_default_window_applies_when_hello_sends_null() -> None:
    h = Harness(limits=ProtocolLimits(default_window_bytes=8192))
    h.hello(window_bytes=None)
    assert h.session.flow is not None and h.session.flow.window == 8192


def test_acking_more_than_in_flight_closes_the_connection() -> None:
    h = Harness()
    h.hello()
    assert h.session.flow is not None
    assert h.client("ack", bytes=h.session.flow.in_flight + 1) == [error("ack_exceeds_in_flight", "bytes"), {"close": 1008}]


def test_frames_before_hello_do_not_count() -> None:
    h = Harness()
    h.session.sent(10)  # e.g. an error frame
    assert h.session.flow is None


# ====================================================================== whole transcript


def test_full_conversation_transcript() -> None:
    h = Harness(partition_count=4)
    h.infos[3] = PartitionInfo("active", 40, 0, (FailoverEntry(B, 40), FailoverEntry(A, 0)))
    s = h.session
    log = []
    log += h.hello(partitions=[0, 3], codec="binary", window_bytes=1 << 20)
    log += h.open(0)
    log += h.open(3, start=45, snap=(41, 45))  # branch moved to B at 40: partial snapshot
    log += h.open(3, start=40, snap=(40, 40))  # retried after rolling back
    log += h.client("barrier", cookie="cut-1")
    while (p := s.next_visit()) is not None:
        log += h.visit(p, (1, 40, "disk", [[40]]))
    log += h.client("ack", bytes=10)
    assert log == [
        {"lookup": [0, 3]},
        {"type": "failover_logs", "partitions": [0, 3]},
        {"lookup_stream": 0},
        ok(0),
        {"lookup_stream": 3},
        {"type": "stream_response", "partition": 3, "status": "rollback", "rollback_seqno": 40, "reason": "diverged"},
        {"lookup_stream": 3},
        ok(3),
        {"visit": 0, "after": 0},
        {"type": "snapshot", "partition": 0, "start": 1, "end": 40, "source": "disk", "purge_seqno": 0},
        {"items": [40], "last": True},
        {"visit": 3, "after": 40},
        {"type": "snapshot", "partition": 3, "start": 1, "end": 40, "source": "disk", "purge_seqno": 0},
        {"items": [40], "last": True},
        {"type": "barrier", "cookie": "cut-1", "seqnos": {"0": 40, "3": 40}},
        {"type": "cycle_complete", "cycle": 1},
    ]
    assert s.flow is not None and s.flow.acked == 10
    assert s.receive_message(Ack(0)) == []


@pytest.mark.parametrize("start, end, source, purge", [(1, 100, "disk", 0), (101, 140, "memory", 7)])
def test_marker_sent_is_snapshot_marker_without_the_message(start: int, end: int, source: str, purge: int) -> None:
    states = []
    for use_message in (True, False):
        h = Harness()
        h.hello()
        h.open(2)
        s = h.session
        s.begin_visit(2)
        if use_message:
            assert s.snapshot_marker(2, start, end, source, purge).end == end
        else:
            assert s.marker_sent(2, start, end, purge) is None
        st = s.streams[2]
        states.append((st.snap_start, st.snap_end, st.purge_seqno, st.in_snapshot))
    assert states[0] == states[1] == (start, end, purge, True)


@pytest.mark.parametrize(
    ("name", "parts", "continue_after", "expected"),
    [
        ("a fresh reading sends each part as its own snapshot", [(11, 20), (21, 30)], None,
         [PartPlan((11, 20), True), PartPlan((21, 30), True)]),
        ("one part", [(5, 9)], None, [PartPlan((5, 9), True)]),
        ("a re-read after a drop continues the open snapshot, one marker to the new end", [(16, 20), (21, 40)], 15,
         [PartPlan((16, 40), False), PartPlan(None, True)]),
        ("a one-part continuation", [(8, 12)], 7, [PartPlan((8, 12), True)]),
        ("the continuation starts right after the last item sent, whatever the part's start", [(3, 12)], 7,
         [PartPlan((8, 12), True)]),
        ("nothing to read", [], None, []),
    ],
)
def test_plan_reading_decides_markers_and_last_batches(
    name: str, parts: list[tuple[int, int]], continue_after: int | None, expected: list[PartPlan]
) -> None:
    assert plan_reading(parts, continue_after) == expected
