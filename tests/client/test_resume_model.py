"""Resume and rollback, sans-I/O: the client's pure parts against a simulated DCP partition.

The server side is a model of one partition (writes, deduplicated snapshots sent in small
batches, persistence, crashes that lose the unpersisted tail and start a new failover branch) that
answers stream requests with ``engine.core.rollback.decide``.  The client side is what
``clients.consumer`` does, driven by hand: ``ClientSession`` + ``PartitionPosition`` + the ring,
a mirror dict as the application, "GET" corrections read from the model.  Hypothesis throws random
schedules of writes, deletes, partial deliveries, state saves, consumer crashes (unsaved progress
lost, mirror and ring kept), connection drops and server crashes at it; at the end the mirror must
equal the server (the property test_mirror checks with real processes, here over thousands of
schedules and every cut point, including mid-snapshot).
"""
from __future__ import annotations

import itertools

from hypothesis import example, given, settings
from hypothesis import strategies as st

from clients.ring import RollbackRing
from clients.state import MemoryStateStore
from engine.core.rollback import MustRollBack, StreamPosition, decide
from engine.core.types import FailoverEntry
from engine.protocol.client.session import ClientSession
from engine.protocol.messages import PartitionInfo

KEYS = [b"a", b"b", b"c", b"d", b"e"]


class PartitionModel:
    def __init__(self) -> None:
        self.uuids = itertools.count(1000)
        self.items: dict[int, tuple[bytes, bytes | None]] = {}
        self.high = 0
        self.persisted = 0
        self.log = [FailoverEntry(next(self.uuids), 0)]

    def write(self, key: bytes, value: bytes | None) -> None:
        self.high += 1
        self.items[self.high] = (key, value)

    def crash(self) -> None:
        self.items = {s: kv for s, kv in self.items.items() if s <= self.persisted}
        self.high = self.persisted
        self.log = [FailoverEntry(next(self.uuids), self.persisted)] + [e for e in self.log if e.seqno <= self.persisted]

    def latest(self, after: int) -> list[tuple[int, bytes, bytes | None]]:
        last: dict[bytes, int] = {}
        for s in sorted(self.items):
            if s > after:
                last[self.items[s][0]] = s
        return sorted((s, k, self.items[s][1]) for k, s in last.items())

    def live(self) -> dict[bytes, bytes]:
        return {k: v for _, k, v in self.latest(0) if v is not None}

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        found = [(s, v) for s, (k, v) in self.items.items() if k == key]
        if not found:
            return None
        s, v = max(found)
        return None if v is None else (s, v)


class Client:
    """What clients.consumer does for one partition, minus the sockets."""

    def __init__(self, server: PartitionModel, ring_size: int) -> None:
        self.server = server
        self.store = MemoryStateStore()
        self.ring = RollbackRing(ring_size)
        self.mirror: dict[bytes, bytes] = {}
        self.frames: list[tuple] = []
        self.sent = 0
        self.session: ClientSession | None = None
        self.rollbacks = self.resets = 0

    def connect(self, fresh: bool) -> None:
        if fresh or self.session is None:
            self.session = ClientSession(start="saved", saved=self.store.load(), ring=self.ring)
        else:
            self.session.connection_lost()
        s = self.server
        info = {0: PartitionInfo("active", s.high, 0, tuple(s.log))}
        reqs = self.session.handshake("node", 1, info)
        for plan in list(self.session.repairs.values()):
            corrected = self.correct(plan)
            reqs.append(self.session.finish_repair(plan, corrected))
        (req,) = reqs
        while True:
            verdict = decide(s.log, s.high, 0, StreamPosition(req.uuid, req.start_seqno, req.snap_start, req.snap_end))
            if not isinstance(verdict, MustRollBack):
                break
            plan = self.session.plan_rollback(0, verdict.seqno, verdict.reason.value, verdict.detail, s.log)
            self.rollbacks += 1
            req = self.session.finish_rollback(plan, self.correct(plan))
            self.store.save(self.session.state())
        self.session.stream_ok(0, s.log)
        self.sent = req.start_seqno
        self.frames = []
        self.refill()

    def correct(self, plan) -> list[tuple[bytes, int]]:
        """Apply a plan's corrections (current documents, "GET") or its reset to the mirror."""
        corrected = []
        if plan.reset:
            self.resets += 1
            self.mirror.clear()
        for key in plan.keys:
            doc = self.server.get(key)
            if doc is None:
                self.mirror.pop(key, None)
                if self.server.high > plan.seqno:  # the tombstone's seqno is unknown, but <= high
                    corrected.append((key, self.server.high))
            else:
                self.mirror[key] = doc[1]
                if doc[0] > plan.seqno:
                    corrected.append((key, doc[0]))
        return corrected

    def refill(self) -> None:
        """The server's next snapshot (everything after what it sent), in batches of up to 2 items."""
        s = self.server
        if self.frames or s.high <= self.sent:
            return
        items = s.latest(self.sent)
        self.frames.append(("marker", self.sent + 1, s.high))
        for i in range(0, len(items), 2):
            self.frames.append(("batch", items[i:i + 2], i + 2 >= len(items)))
        self.sent = s.high

    def deliver(self, n: int) -> None:
        pos = self.session.positions[0]
        for _ in range(n):
            self.refill()
            if not self.frames:
                return
            frame = self.frames.pop(0)
            if frame[0] == "marker":
                pos.snapshot_marker(frame[1], frame[2])
                continue
            batch, last = frame[1], frame[2]
            self.ring.append_batch(0, [s for s, _, _ in batch], [k for _, k, _ in batch])  # before applying
            for _, k, v in batch:
                if v is None:
                    self.mirror.pop(k, None)
                else:
                    self.mirror[k] = v
            pos.items(batch[0][0], batch[-1][0])  # processed
            if last:
                pos.snapshot_end()

    def save(self) -> None:
        self.store.save(self.session.state())


op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(KEYS), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.just(0)),
    st.tuples(st.just("persist"), st.just(b""), st.just(0)),
    st.tuples(st.just("deliver"), st.just(b""), st.integers(1, 4)),
    st.tuples(st.just("save"), st.just(b""), st.just(0)),
    st.tuples(st.just("consumer_crash"), st.just(b""), st.just(0)),
    st.tuples(st.just("disconnect"), st.just(b""), st.just(0)),
    st.tuples(st.just("server_crash"), st.just(b""), st.just(0)),
)


@settings(max_examples=600, deadline=None)
@given(schedule=st.lists(op, max_size=60), ring_size=st.sampled_from([2, 4, 1000]))
# a partial snapshot whose first seqno was deduplicated away, then a crash back to that seqno:
# the consumer must roll back to the end of the snapshot before it, or it never gets ``c``
@example(schedule=[("write", b"c", 0), ("persist", b"", 0), ("write", b"a", 0), ("delete", b"b", 0),
                   ("write", b"c", 0), ("deliver", b"", 2), ("server_crash", b"", 0)], ring_size=2)
def test_mirror_equals_server_after_any_schedule(schedule, ring_size):
    server = PartitionModel()
    client = Client(server, ring_size)
    client.connect(fresh=True)
    version = itertools.count()
    for name, key, n in schedule:
        if name == "write":
            server.write(key, b"%s-%d" % (key, next(version)))
        elif name == "delete":
            server.write(key, None)
        elif name == "persist":
            server.persisted = server.high
        elif name == "deliver":
            client.deliver(n)
        elif name == "save":
            client.save()
        elif name == "consumer_crash":
            client.connect(fresh=True)  # unsaved positions lost; mirror and ring are durable
        elif name == "disconnect":
            client.connect(fresh=False)
        else:
            server.crash()
            client.connect(fresh=False)
        assert len(client.ring) <= ring_size
    client.deliver(10_000)
    assert client.mirror == server.live()
