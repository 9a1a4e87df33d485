"""A ``persisted`` session against a model engine, over random schedules (hypothesis).

The model keeps per partition a high seqno and a persisted seqno; writes bump the first, flushes
catch the second up, and the flusher's reports reach the session (``visible_ceiling``) only when
the schedule says so, late or never.  Each visit reads, after it began, the parts an engine
snapshot would have (disk up to the persisted seqno, memory above it), takes the ceiling (the
persisted seqno *now*) and sends the ``visible_parts``, as ``app.stream`` does.  Checked:

* nothing above the persisted seqno is ever promised or sent (markers end at or below it);
* the barrier guarantee as this consumer sees it: a cookie comes back only once every stream
  open when it was sent has been delivered the high seqno its partition had then (so it waits
  for those writes to be persisted);
* liveness: once writes stop and everything is flushed and reported, the loop drains, every
  cookie has come back and every position is its partition's high seqno.
"""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.types import FailoverEntry
from engine.protocol.messages import (
    Ack,
    Barrier,
    BarrierReachedMessage,
    Hello,
    PartitionInfo,
    StreamRequest,
    Visibility,
    encode,
)
from engine.protocol.reading_plan import visible_parts
from engine.protocol.session import LookupPartitions, LookupStream, ServerSession, Visit

PARTITIONS = 3
FRAME = 1000
WINDOW = 8192

actions = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, PARTITIONS - 1)),
        st.tuples(st.just("write"), st.integers(0, PARTITIONS - 1)),
        st.tuples(st.just("flush"), st.integers(0, PARTITIONS - 1)),
        st.tuples(st.just("report"), st.integers(0, PARTITIONS - 1)),
        st.tuples(st.just("cookie"), st.just(0)),
        st.tuples(st.just("step"), st.just(0)),
        st.tuples(st.just("step"), st.just(0)),
        st.tuples(st.just("ack"), st.just(0)),
    ),
    max_size=100,
)


class Model:
    def __init__(self) -> None:
        self.high = [0] * PARTITIONS
        self.persisted = [0] * PARTITIONS
        self.session = ServerSession(node_id="n", partition_count=PARTITIONS)
        self.visit: tuple[Visit, int, int] | None = None  # visit in progress, its reading (persisted, high)
        self.cookies: dict[str, dict[int, int]] = {}
        self.released: list[str] = []
        self.next_cookie = 0
        self.run(self.session.receive_message(Hello("t", window_bytes=WINDOW, visibility=Visibility.PERSISTED)))
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
                    required = self.cookies.pop(out.cookie)
                    for p, seqno in required.items():
                        assert self.session.streams[p].position >= seqno, (out.cookie, p)
                        assert out.seqnos[p] >= seqno
                    self.released.append(out.cookie)

    def do(self, op: str, arg: int) -> None:
        s = self.session
        if op == "write":
            self.high[arg] += 1
            s.notify(arg)
        elif op == "flush":
            self.persisted[arg] = self.high[arg]
        elif op == "report":
            s.visible_ceiling(arg, self.persisted[arg])
        elif op == "cookie":
            cookie = f"c{self.next_cookie}"
            self.next_cookie += 1
            self.cookies[cookie] = {p: self.high[p] for p in s.streams}
            self.run(s.receive_message(Barrier(cookie)))
        elif op == "ack":
            assert s.flow is not None
            self.run(s.receive_message(Ack(s.flow.in_flight)))
        elif op == "step":
            self.step()

    def step(self) -> bool:
        """Advance the loop by half a visit; False when there was nothing to do."""
        s = self.session
        if self.visit is None:
            p = s.next_visit()
            if p is None:
                return False
            self.visit = (s.begin_visit(p), self.persisted[p], self.high[p])  # the snapshot
            return True
        visit, persisted, high = self.visit
        self.visit = None
        p = visit.partition
        after = visit.after_seqno
        parts = []
        if persisted > after:
            parts.append((after + 1, persisted))
        if high > max(after, persisted):
            parts.append((max(after, persisted) + 1, high))
        ceiling = self.persisted[p]  # read after the snapshot
        n = visible_parts(parts, ceiling)
        for start, end in parts[:n]:
            assert end <= self.persisted[p]
            self.run([s.snapshot_marker(p, start, end, "disk", 0)])
            s.sent(FRAME)
            self.run(s.items_sent(p, end, True))
            assert s.streams[p].position <= self.persisted[p]
        held = parts[-1][1] if n < len(parts) else None
        self.run(s.end_visit(visit, ceiling=ceiling, held_back_to=held))
        return True


@settings(max_examples=300, deadline=None)
@given(actions)
def test_nothing_unpersisted_is_sent_cookies_wait_for_persistence_and_the_loop_drains(
    schedule: list[tuple[str, int]],
) -> None:
    model = Model()
    for op, arg in schedule:
        model.do(op, arg)
    for p in range(PARTITIONS):  # writes stop; everything is flushed and the flusher reports it
        model.do("flush", p)
        model.do("report", p)
    for _ in range(20 * PARTITIONS + 20):
        model.do("ack", 0)
        if not model.step() and model.visit is None:
            break
    s = model.session
    assert s.next_visit() is None
    assert model.cookies == {}, f"cookies never released: {sorted(model.cookies)}"
    for p, stream in s.streams.items():
        assert stream.position == model.high[p]
    assert model.released == sorted(model.released, key=lambda c: int(c[1:]))
