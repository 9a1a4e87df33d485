"""A stored failover log with a bad entry, read back through a real ``Engine.open``.

One bad newest entry must not cost the valid history behind it: a consumer positioned on an
older branch still resumes where it was instead of being sent back to 0."""
from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import lmdb

from engine.core.rollback import StreamOk, StreamPosition, decide
from engine.core.types import FailoverEntry, Op, PartitionState, WriteOp
from engine.engine import Engine

_ENTRY = struct.Struct(">QQ")  # the stored form: uuid, seqno, newest first


def _store_raw_failover_log(data_dir: Path, partition: int, entries: list[tuple[int, int]]) -> None:
    """Write the stored failover log bytes directly, as a damaged disk or an older bug would."""
    env = lmdb.open(str(data_dir), max_dbs=64)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True) as txn:
            txn.put(b"failover/%d" % partition, b"".join(_ENTRY.pack(u, s) for u, s in entries), db=meta)
    finally:
        env.close()


def test_bad_newest_entry_is_erased_and_older_branches_kept(make_engine: Callable[..., Engine],
                                                          tmp_path: Path) -> None:
    engine = make_engine(partitions=1)
    for i in range(10):
        engine.write(WriteOp(Op.MUTATION, f"a{i}", b"v"))
    engine.set_state(0, PartitionState.REPLICA)
    engine.set_state(0, PartitionState.ACTIVE)  # a second branch from seqno 10
    for i in range(10):
        engine.write(WriteOp(Op.MUTATION, f"b{i}", b"v"))
    engine.flush_now()
    log = engine.failover_log(0)
    assert len(log) == 2 and log[0].seqno == 10
    consumer = StreamPosition(uuid=log[0].uuid, start_seqno=20, snap_start=20, snap_end=20)
    assert isinstance(decide(log, 20, 0, consumer), StreamOk)
    engine.close()

    # a newest entry with uuid 0 in front of the valid log
    _store_raw_failover_log(tmp_path / "data", 0, [(0, 20), *[(e.uuid, e.seqno) for e in log]])
    reopened = make_engine(partitions=1)
    assert reopened.opened_clean
    assert reopened.failover_log(0) == log
    assert isinstance(decide(reopened.failover_log(0), reopened.high_seqno(0), 0, consumer), StreamOk)


def test_bad_middle_entry_alone_is_erased_after_an_unclean_stop(make_engine: Callable[..., Engine],
                                                               tmp_path: Path) -> None:
    """Without the clean marker the open adds a branch on top of what the sanitiser kept."""
    engine = make_engine(partitions=1)
    for i in range(5):
        engine.write(WriteOp(Op.MUTATION, f"k{i}", b"v"))
    engine.flush_now()
    (first,) = engine.failover_log(0)
    engine.close()

    u_bad, u_top = 0xBAD, 0x70F
    # newest first: a valid top entry at 5, then an entry whose seqno ascends (bad), then the first
    _store_raw_failover_log(tmp_path / "data", 0, [(u_top, 5), (u_bad, 9), (first.uuid, first.seqno)])
    env = lmdb.open(str(tmp_path / "data"), max_dbs=64)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True) as txn:
            txn.delete(b"clean", db=meta)
    finally:
        env.close()
    reopened = make_engine(partitions=1)
    assert not reopened.opened_clean
    newest, *rest = reopened.failover_log(0)
    assert newest.seqno == 5 and newest.uuid not in (0, u_top, u_bad, first.uuid)
    assert rest == [FailoverEntry(u_top, 5), first]
    consumer = StreamPosition(uuid=first.uuid, start_seqno=3, snap_start=3, snap_end=3)
    assert isinstance(decide(reopened.failover_log(0), reopened.high_seqno(0), 0, consumer), StreamOk)
