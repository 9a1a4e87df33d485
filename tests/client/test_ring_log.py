"""The ring split: the pure ``RingModel`` (updated by the session, no I/O) journals its records, and
``RollbackRing``'s log file writes them, in order, when flushed; replaying the file gives the model."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clients.ring import FILE_NAME, RollbackRing
from engine.core.types import FailoverEntry as FE
from engine.protocol.client.ring import RingModel
from engine.protocol.client.session import ClientSession
from engine.protocol.messages import PartitionInfo

INFOS = {0: PartitionInfo("active", 9, 0, (FE(5, 0),)), 1: PartitionInfo("active", 4, 0, (FE(6, 0),))}


def test_session_updates_reach_the_file_only_when_the_adapter_flushes(tmp_path):
    ring = RollbackRing(10, tmp_path)
    size = (tmp_path / FILE_NAME).stat().st_size
    session = ClientSession(start="beginning", ring=ring.model)
    session.handshake("n", 2, INFOS)
    assert ring.floor(0) == ring.floor(1) == 0
    assert (tmp_path / FILE_NAME).stat().st_size == size       # the session wrote nothing
    ring.sync()                                                 # what the consumer does before saving
    assert RollbackRing(10, tmp_path).floor(1) == 0


def test_an_adapter_append_writes_the_session_records_first(tmp_path):
    ring = RollbackRing(10, tmp_path)
    ring.model.set_floor(3, 7)          # a session update, queued
    ring.append_batch(3, [8, 9], [b"a", b"b"])
    again = RollbackRing(10, tmp_path)
    assert again.floor(3) == 7 and [e.seqno for e in again.entries(3)] == [8, 9]


ops = st.lists(st.one_of(
    st.tuples(st.just("batch"), st.integers(0, 2), st.integers(1, 5)),
    st.tuples(st.just("drop"), st.integers(0, 2), st.integers(0, 30)),
    st.tuples(st.just("replace"), st.integers(0, 2), st.integers(0, 30)),
    st.tuples(st.just("floor"), st.integers(0, 2), st.integers(0, 30)),
    st.tuples(st.just("reset"), st.integers(0, 2), st.just(0)),
), max_size=30)


@settings(max_examples=150, deadline=None)
@given(cap=st.integers(1, 10), program=ops)
def test_replaying_the_journal_rebuilds_the_model(cap, program):
    model = RingModel(cap, journal=True)
    seqnos = {0: 0, 1: 0, 2: 0}
    for op, p, n in program:
        if op == "batch":
            batch = list(range(seqnos[p] + 1, seqnos[p] + 1 + n))
            seqnos[p] = batch[-1]
            model.append_batch(p, batch, [b"k%d" % s for s in batch])
        elif op == "drop":
            model.drop_above(p, n)
        elif op == "replace":
            model.replace_above(p, n, [(b"c%d" % n, n + 1)])
            seqnos[p] = max(seqnos[p], n + 1)
        elif op == "floor":
            model.set_floor(p, n)
        else:
            model.reset(p)
    replayed = RingModel(cap)
    for payload, _ in model.take_journal():
        replayed.apply(payload)
    assert replayed.entries() == model.entries()
    assert all(replayed.floor(p) == model.floor(p) for p in range(3))
