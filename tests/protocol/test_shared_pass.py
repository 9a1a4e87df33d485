"""Shared passes (``engine.protocol.shared_pass``): the same messages and the same session state as
carrying the visits out one message at a time, or a refusal that changes nothing.

Checked over random schedules (hypothesis) with many consumers on one model engine: each
consumer's session does every pass the shared way when ``take_shared`` accepts it and the usual
way otherwise, and a twin session always does it the usual way; both must send exactly the same
sequence (markers, batches, cookies, ``cycle_complete``, stream ends) and end at the same
positions, and the barrier guarantee must hold for every consumer.
"""
from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.types import FailoverEntry
from engine.protocol.bundle import OVERHEAD, decode_bundle, encode_parts
from engine.protocol.messages import (
    Ack,
    Barrier,
    BarrierReachedMessage,
    CloseStream,
    Hello,
    PartitionInfo,
    StreamRequest,
    Visibility,
    encode,
)
from engine.protocol.session import LookupPartitions, LookupStream, ServerSession, Visit
from engine.protocol.shared_pass import BatchStep, MarkerStep, SharedReading, idle_reading, take_shared

PARTITIONS = 4
FRAME = 300  # bytes per item batch in this model
BIG = 1 << 20


def reading(p: int, after: int, end: int) -> SharedReading:
    """What a visit from ``after`` sends when the partition's high seqno is ``end``."""
    if end <= after:
        return idle_reading(p, after)
    marker = f'{{"type":"snapshot","partition":{p},"start":{after + 1},"end":{end}}}'
    batch = f"items {p} {after + 1}..{end}".encode().ljust(FRAME, b".")
    steps = (MarkerStep(after + 1, end, 0), BatchStep(end, True))
    return SharedReading(p, after, end, steps, encode_parts([marker, batch]), 2, len(marker) + len(batch))


def table_reading(p: int, after: int, end: int) -> SharedReading:
    """``reading`` in the one-batch shape a memory reading of the tail has (``SharedReading.one_batch``)."""
    if end <= after:
        return idle_reading(p, after)
    marker = f'{{"type":"snapshot","partition":{p},"start":{after + 1},"end":{end}}}'
    batch = f"items {p} {after + 1}..{end}".encode().ljust(FRAME, b".")
    return SharedReading.one_batch(p, after, end, (after + 1, end, 0), end, encode_parts([marker, batch]),
                                   len(marker) + len(batch))


class Consumer:
    """One connection's session, fed as the stream server feeds it; ``sent`` is what it sent."""

    def __init__(self, engine: "Engine", window: int, end_seqno: int | None = None,
                 visibility: Visibility = Visibility.MEMORY) -> None:
        self.engine = engine
        self.session = ServerSession(node_id="n", partition_count=PARTITIONS)
        self.sent: list[Any] = []
        self.cookies: dict[str, dict[int, int]] = {}
        self.shared = 0
        self.run(self.session.receive_message(Hello("t", window_bytes=window, visibility=visibility)))
        for p in range(PARTITIONS):
            self.run(self.session.receive_message(
                StreamRequest(p, uuid=1, start_seqno=0, snap_start=0, snap_end=0, end_seqno=end_seqno)))

    def run(self, outs: list[Any]) -> None:
        for out in outs:
            if isinstance(out, LookupPartitions):
                self.run(self.session.partitions_info({p: self.engine.info(p) for p in out.partitions}))
            elif isinstance(out, LookupStream):
                self.run(self.session.stream_info(out.partition, self.engine.info(out.partition)))
            else:
                self.session.sent(len(encode(out)))
                self.sent.append(encode(out))
                if isinstance(out, BarrierReachedMessage):
                    required = self.cookies.pop(out.cookie)
                    for p, seqno in required.items():
                        if p in self.session.streams:
                            assert self.session.streams[p].position >= seqno, (out.cookie, p)

    def cookie(self, name: str) -> None:
        self.cookies[name] = {p: self.engine.high[p] for p in self.session.streams}
        self.run(self.session.receive_message(Barrier(name)))

    def one_by_one(self, visits: list[Visit]) -> None:
        """The usual path: each visit's messages, each only while the window allows."""
        s = self.session
        for visit in visits:
            p = visit.partition
            r = reading(p, visit.after_seqno, self.engine.high[p])
            for step in r.steps:
                if not s.is_open(p) or not s.can_send:
                    break
                if isinstance(step, MarkerStep):
                    s.marker_sent(p, step.start, step.end, step.purge_seqno)
                    self.sent.append(("marker", p, step.start, step.end))
                else:
                    self.sent.append(("batch", p, step.last_seqno, step.last))
                    s.sent(FRAME)
                    self.run(s.items_sent(p, step.last_seqno, step.last))
            self.run(s.end_visit(visit))

    def pass_table(self) -> bool:
        """A pass as the hub's delivery makes it: the whole pass from one-batch readings in one
        call (``take_readings``) when the session accepts it, else the shared or usual way."""
        s = self.session
        partitions = s.peek_visits(64)
        if partitions:
            readings = [table_reading(p, s.streams[p].position, self.engine.high[p]) for p in partitions]
            before = _state(copy.deepcopy(s.__dict__))
            outs = s.take_readings(readings, BIG)
            if outs is not None:
                self.shared += 1
                for r in readings:
                    if r.count:
                        start, end, _purge = r.marker  # type: ignore[misc]
                        self.sent.append(("marker", r.partition, start, end))
                        self.sent.append(("batch", r.partition, r.last_seqno, True))
                        s.sent(FRAME)
                self.run(outs)
                return True
            assert _state(s.__dict__) == before, "a refused table pass changed the session"
        return self.pass_(True)

    def pass_(self, shared: bool) -> bool:
        s = self.session
        # the session tracks which streams may be due instead of scanning them all: same answer
        assert sorted(s._due_now()) == sorted(p for p, st in s.streams.items() if s._due(st))
        visits = s.begin_visits(64)
        if not visits:
            return False
        if shared:
            readings = [reading(v.partition, v.after_seqno, self.engine.high[v.partition]) for v in visits]
            before = _state(copy.deepcopy(s.__dict__))
            outs = take_shared(s, visits, readings, BIG)
            if outs is not None:
                self.shared += 1
                for r in readings:
                    for step in r.steps:
                        if isinstance(step, MarkerStep):
                            self.sent.append(("marker", r.partition, step.start, step.end))
                        else:
                            self.sent.append(("batch", r.partition, step.last_seqno, step.last))
                            s.sent(FRAME)
                self.run(outs)
                return True
            assert _state(s.__dict__) == before, "a refused shared pass changed the session"
        self.one_by_one(visits)
        return True


def _view(sent: list[Any]) -> tuple[dict[int, list[Any]], list[str]]:
    """What a consumer can rely on: each partition's messages in order (markers, batches, its
    stream end), and the order of the connection's control messages (cookies, stream ends,
    ``cycle_complete``).  Where another partition's items fall between them is not promised
    (a shared pass sends the pass's control messages after its items)."""
    per_partition: dict[int, list[Any]] = {}
    controls: list[str] = []
    for msg in sent:
        if isinstance(msg, tuple):
            per_partition.setdefault(msg[1], []).append(msg)
            continue
        controls.append(msg)
        obj = json.loads(msg)
        if "partition" in obj:
            per_partition.setdefault(obj["partition"], []).append(msg)
    return per_partition, controls


def _state(d: dict[str, Any]) -> Any:
    """The session's state as plain values (its helper objects compare by identity)."""
    return _plain({k: v for k, v in d.items() if k not in ("_handlers",)})


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return type(x)(_plain(v) for v in x) if not isinstance(x, (set, frozenset)) else frozenset(map(repr, x))
    if hasattr(x, "__dict__") and not isinstance(x, type):
        return (type(x).__name__, _plain(vars(x)))
    slots = getattr(type(x), "__slots__", None)
    if slots and not isinstance(x, (str, bytes, int)):
        return (type(x).__name__, {k: _plain(getattr(x, k, None)) for k in slots})
    return x


class Engine:
    def __init__(self) -> None:
        self.high = [0] * PARTITIONS

    def info(self, p: int) -> PartitionInfo:
        return PartitionInfo("active", self.high[p], 0, (FailoverEntry(1, 0),))


actions = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, PARTITIONS - 1)),
        st.tuples(st.just("cookie"), st.integers(0, 5)),
        st.tuples(st.just("pass"), st.integers(0, 5)),
        st.tuples(st.just("pass"), st.integers(0, 5)),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("close"), st.integers(0, PARTITIONS * 6 - 1)),
    ),
    max_size=80,
)


@settings(max_examples=100, deadline=None)
@given(actions, st.lists(st.sampled_from([4096, 5000, 8192, BIG]), min_size=6, max_size=6),
       st.lists(st.sampled_from([None, 3, 8]), min_size=6, max_size=6))
def test_shared_passes_send_what_one_by_one_passes_send(schedule: list[tuple[str, int]], windows: list[int],
                                                        ends: list[int | None]) -> None:
    """Three twins per consumer: shared passes, table passes (``take_readings``), one by one."""
    engine = Engine()
    consumers = [(Consumer(engine, w, e), Consumer(engine, w, e), Consumer(engine, w, e)) for w, e in zip(windows, ends)]
    cookies = 0
    for op, arg in schedule:
        if op == "write":
            engine.high[arg] += 1
            for trio in consumers:
                for c in trio:
                    c.session.notify(arg)
        elif op == "cookie":
            for c in consumers[arg]:
                c.cookie(f"k{cookies}")
            cookies += 1
        elif op == "ack":
            for c in consumers[arg]:
                c.run(c.session.receive_message(Ack(c.session.flow.in_flight)))  # type: ignore[union-attr]
        elif op == "close":
            for c in consumers[arg // PARTITIONS]:
                if c.session.is_open(arg % PARTITIONS):
                    c.run(c.session.receive_message(CloseStream(arg % PARTITIONS)))
        else:
            shared, usual, table = consumers[arg]
            shared.pass_(True)
            usual.pass_(False)
            table.pass_table()
    for shared, usual, table in consumers:  # writes stop: drain all three
        for _ in range(4 * PARTITIONS + 4):
            for c in (shared, usual, table):
                c.run(c.session.receive_message(Ack(c.session.flow.in_flight)))  # type: ignore[union-attr]
            a, b, t = shared.pass_(True), usual.pass_(False), table.pass_table()
            assert a == b == t
            if not a:
                break
        assert _view(shared.sent) == _view(usual.sent) == _view(table.sent)
        assert shared.session.positions == usual.session.positions == table.session.positions
        assert shared.session.cycle == usual.session.cycle == table.session.cycle
        assert shared.cookies == usual.cookies == table.cookies == {}
        for p, stream in table.session.streams.items():
            assert stream.position == engine.high[p]


def _begun(consumer: Consumer) -> list[Visit]:
    return consumer.session.begin_visits(64)


@pytest.mark.parametrize(
    "case",
    [
        "reading_at_another_position",
        "window_too_small",
        "bundle_too_small",
        "capped_stream",
        "bounded_stream_ends_inside_the_reading",
        "in_snapshot",
        "reading_for_another_partition",
    ],
)
def test_refusals_change_nothing(case: str) -> None:
    engine = Engine()
    engine.high = [5, 5, 5, 5]
    window, end_seqno, visibility, max_bytes = BIG, None, Visibility.MEMORY, BIG
    if case == "window_too_small":
        window = 4096
    if case == "bounded_stream_ends_inside_the_reading":
        end_seqno = 3
    if case == "capped_stream":
        visibility = Visibility.PERSISTED
    if case == "bundle_too_small":
        max_bytes = OVERHEAD + 100
    c = Consumer(engine, window, end_seqno, visibility)
    s = c.session
    if case == "capped_stream":
        for p in range(PARTITIONS):
            s.visible_ceiling(p, 5)
    if case == "window_too_small":
        s.sent(3500)
    visits = _begun(c)
    readings = [reading(v.partition, v.after_seqno, 5) for v in visits]
    if case == "reading_at_another_position":
        readings[1] = reading(visits[1].partition, 1, 5)
    if case == "in_snapshot":
        s.streams[visits[0].partition].in_snapshot = True
    if case == "reading_for_another_partition":
        readings[0], readings[1] = readings[1], readings[0]
    before = _state(copy.deepcopy(s.__dict__))
    assert take_shared(s, visits, readings, max_bytes) is None
    assert _state(s.__dict__) == before


def test_a_shared_pass_ends_the_pass_with_cycle_complete_and_moves_every_position() -> None:
    engine = Engine()
    engine.high = [3, 0, 7, 1]
    c = Consumer(engine, BIG)
    visits = _begun(c)
    readings = [reading(v.partition, v.after_seqno, engine.high[v.partition]) for v in visits]
    outs = take_shared(c.session, visits, readings, BIG)
    assert outs is not None and [encode(o) for o in outs] == ['{"type":"cycle_complete","cycle":1}']
    assert c.session.positions == {0: 3, 1: 0, 2: 7, 3: 1}
    assert [decode_bundle(b"UPRM\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00" + readings[0].parts)[0]][0].startswith(
        '{"type":"snapshot","partition":0,"start":1,"end":3')


@pytest.mark.parametrize(
    "case",
    [
        "reading_at_another_position",
        "window_too_small",
        "bundle_too_small",
        "capped_stream",
        "bounded_stream",
        "in_snapshot",
        "cookie_pending",
        "visit_in_progress",
        "stepped_reading",
    ],
)
def test_table_refusals_change_nothing(case: str) -> None:
    engine = Engine()
    engine.high = [5, 5, 5, 5]
    window, end_seqno, visibility, max_bytes = BIG, None, Visibility.MEMORY, BIG
    if case == "window_too_small":
        window = 4096
    if case == "bounded_stream":
        end_seqno = 100
    if case == "capped_stream":
        visibility = Visibility.PERSISTED
    if case == "bundle_too_small":
        max_bytes = OVERHEAD + 100
    c = Consumer(engine, window, end_seqno, visibility)
    s = c.session
    if case == "capped_stream":
        for p in range(PARTITIONS):
            s.visible_ceiling(p, 5)
    if case == "window_too_small":
        s.sent(s.flow.available - 1000)  # type: ignore[union-attr]  # room for two readings, not four
    if case == "cookie_pending":
        c.cookie("k")
    partitions = s.peek_visits(64)
    assert partitions
    readings = [table_reading(p, 0, 5) for p in partitions]
    if case == "reading_at_another_position":
        readings[1] = table_reading(partitions[1], 1, 5)
    if case == "in_snapshot":
        s.streams[partitions[0]].in_snapshot = True
    if case == "visit_in_progress":
        s.begin_visit(partitions[-1])
    if case == "stepped_reading":
        readings[0] = reading(partitions[0], 0, 5)
    before = _state(copy.deepcopy(s.__dict__))
    assert s.take_readings(readings, max_bytes) is None
    assert _state(s.__dict__) == before


def test_a_table_pass_is_the_shared_pass_state_for_state() -> None:
    """``take_readings`` leaves the session exactly as ``begin_visit`` + ``take_shared`` do."""
    engine = Engine()
    engine.high = [3, 0, 7, 1]
    table, shared = Consumer(engine, BIG), Consumer(engine, BIG)
    partitions = table.session.peek_visits(64)
    readings = [table_reading(p, 0, engine.high[p]) for p in partitions]
    visits = [shared.session.begin_visit(p) for p in partitions]
    want = take_shared(shared.session, visits, readings, BIG)
    got = table.session.take_readings(readings, BIG)
    assert got is not None and want is not None and [encode(o) for o in got] == [encode(o) for o in want]
    assert _state(table.session.__dict__) == _state(shared.session.__dict__)


def test_a_table_pass_larger_than_a_bundle_is_taken_when_the_window_holds_every_bundle() -> None:
    """The readings go in several bundles (``bundle_cuts``): the window must hold each one's header too."""
    engine = Engine()
    engine.high = [5, 5, 5, 5]
    readings = [table_reading(p, 0, 5) for p in range(PARTITIONS)]
    piece = len(readings[0].parts)
    max_bytes = OVERHEAD + 2 * piece  # two readings per bundle: two bundles
    for window_room, taken in ((4 * piece + OVERHEAD, False), (4 * piece + 2 * OVERHEAD, True)):
        c = Consumer(engine, BIG)
        s = c.session
        s.sent(s.flow.available - window_room)  # type: ignore[union-attr]
        outs = s.take_readings(readings, max_bytes)
        assert (outs is not None) is taken
        if taken:
            assert s.positions == {p: 5 for p in range(PARTITIONS)}
