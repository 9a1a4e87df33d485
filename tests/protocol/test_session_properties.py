"""ServerSession against a model engine, over random schedules (hypothesis).

The model engine keeps one high seqno per partition; writes bump it and notify the session.  The
stream loop is played step by step so writes, cookies, acks and stream closes can land in the
middle of a visit.  Checked:

* the barrier guarantee: when a cookie comes back, every stream that was open when the cookie was
  sent has been delivered at least the high seqno its partition had at that moment, and the
  cookie's seqno vector says so;
* liveness: once writes stop, the loop drains (no visit is due), every cookie has come back and
  every open stream's position equals its partition's high seqno;
* the loop never sends items while the flow-control window is full.
"""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.protocol.messages import (
    Ack,
    Barrier,
    BarrierReachedMessage,
    CloseStream,
    Hello,
    PartitionInfo,
    StreamRequest,
    encode,
)
from engine.protocol.session import LookupPartitions, LookupStream, ServerSession, Visit
from engine.core.types import FailoverEntry

PARTITIONS = 4
FRAME = 1000  # bytes per item frame in this model
WINDOW = 4096

actions = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, PARTITIONS - 1)),
        st.tuples(st.just("cookie"), st.just(0)),
        st.tuples(st.just("step"), st.just(0)),
        st.tuples(st.just("step"), st.just(0)),
        st.tuples(st.just("ack"), st.just(0)),
        st.tuples(st.just("close"), st.integers(0, PARTITIONS - 1)),
    ),
    max_size=80,
)


class Model:
    def __init__(self) -> None:
        self.high = [0] * PARTITIONS
        self.session = ServerSession(node_id="n", partition_count=PARTITIONS)
        self.visit: tuple[Visit, int] | None = None  # visit in progress and its reading
        self.cookies: dict[str, dict[int, int]] = {}  # cookie -> required positions
        self.released: list[str] = []
        self.next_cookie = 0
        self.run(self.session.receive_message(Hello("t", window_bytes=WINDOW)))
        for p in range(PARTITIONS):
            self.run(self.session.receive_message(StreamRequest(p, uuid=1, start_seqno=0, snap_start=0, snap_end=0)))

    def info(self, p: int) -> PartitionInfo:
        return PartitionInfo("active", self.high[p], 0, (FailoverEntry(1, 0),))

    def run(self, outs: list[Any]) -> None:
        for out in outs:
            if isinstance(out, LookupPartitions):
                self.run(self.session.partitions_info({p: self.info(p) for p in out.partitions}))
            elif isinstance(out, LookupStream):
                self.run(self.session.stream_info(out.partition, self.info(out.partition)))
            else:
                self.session.sent(len(encode(out)))
                if isinstance(out, BarrierReachedMessage):
                    self.check_release(out)

    def check_release(self, msg: BarrierReachedMessage) -> None:
        required = self.cookies.pop(msg.cookie)
        for p, seqno in required.items():
            if p in self.session.streams:  # a stream closed meanwhile no longer holds the cookie
                assert self.session.streams[p].position >= seqno, (msg.cookie, p)
                assert msg.seqnos[p] >= seqno
        self.released.append(msg.cookie)

    def do(self, op: str, arg: int) -> None:
        s = self.session
        if op == "write":
            self.high[arg] += 1
            s.notify(arg)
        elif op == "cookie":
            cookie = f"c{self.next_cookie}"
            self.next_cookie += 1
            self.cookies[cookie] = {p: self.high[p] for p in s.streams}
            self.run(s.receive_message(Barrier(cookie)))
        elif op == "ack":
            assert s.flow is not None
            self.run(s.receive_message(Ack(s.flow.in_flight)))
        elif op == "close":
            if s.is_open(arg):
                self.run(s.receive_message(CloseStream(arg)))
        elif op == "step":
            self.step()

    def step(self) -> bool:
        """Advance the loop by half a visit; False when there was nothing to do."""
        s = self.session
        if self.visit is None:
            p = s.next_visit()
            if p is None:
                return False
            self.visit = (s.begin_visit(p), self.high[p])  # the reading
            return True
        visit, reading = self.visit
        self.visit = None
        p = visit.partition
        if s.is_open(p) and reading > visit.after_seqno:
            assert s.can_send or s.flow.in_flight < WINDOW + FRAME  # type: ignore[union-attr]
            self.run([s.snapshot_marker(p, visit.after_seqno + 1, reading, "memory", 0)])
            s.sent(FRAME)
            self.run(s.items_sent(p, reading, True))
        self.run(s.end_visit(visit))
        return True


@settings(max_examples=200, deadline=None)
@given(actions)
def test_barrier_guarantee_and_drain_over_random_schedules(schedule: list[tuple[str, int]]) -> None:
    model = Model()
    for op, arg in schedule:
        model.do(op, arg)
    # Writes stop: ack everything and let the loop drain.
    for _ in range(10 * PARTITIONS + 10):
        model.do("ack", 0)
        if not model.step() and model.visit is None:
            break
    s = model.session
    assert s.next_visit() is None
    assert model.cookies == {}, f"cookies never released: {sorted(model.cookies)}"
    for p, stream in s.streams.items():
        assert stream.position == model.high[p]
    assert model.released == sorted(model.released, key=lambda c: int(c[1:]))  # FIFO
