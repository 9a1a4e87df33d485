"""One writer, the flusher and concurrent snapshot readers: every snapshot is a consistent state.

A snapshot from 0 with high seqno H, replayed part by part, must equal the state after the
write with seqno H: for every key, its latest version at or below H.  The flusher runs every
millisecond, so snapshots straddle flushes, index drops and queue rebases."""
from __future__ import annotations

import random
import threading

from engine.core.types import Op, WriteOp, WriteResult


def test_snapshots_taken_during_writes_and_flushes_are_consistent(make_engine) -> None:
    engine = make_engine(partitions=1, flush_interval_ms=1.0)
    rng = random.Random(11)
    log: dict[int, tuple[bytes, bool, bytes]] = {}  # seqno -> (key, deleted, value)
    done = threading.Event()
    snapshots: list[tuple[int, list[list[tuple[bytes, int, bool, bytes]]]]] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            live: set[str] = set()
            for n in range(400):
                ops = []
                for _ in range(50):
                    key = f"k{rng.randrange(300)}"
                    if key in live and rng.random() < 0.2:
                        ops.append(WriteOp(Op.DELETION, key))
                        live.discard(key)
                    else:
                        ops.append(WriteOp(Op.MUTATION, key, b"%d" % rng.randrange(10**9)))
                        live.add(key)
                for op, res in zip(ops, engine.write_batch(ops)):
                    assert isinstance(res, WriteResult), res
                    log[res.seqno] = (op.key.encode(), res.deleted, op.value)
                if n % 100 == 99:
                    # besides the 1 ms flusher rounds (which a loaded machine may not schedule
                    # while the whole run lasts only tens of ms), flush from time to time
                    engine.flush_now()
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
        finally:
            done.set()

    def reader() -> None:
        try:
            while not done.is_set():
                with engine.snapshot(0, 0) as snap:
                    parts = [[(i.key, i.seqno, i.deleted, i.value) for b in part.batches(max_items=97) for i in b]
                             for part in snap.parts]
                    snapshots.append((snap.high_seqno, parts))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(snapshots) >= 5
    assert engine.engine_stats()["flush_count"] >= 2
    for high, parts in snapshots:
        expected: dict[bytes, tuple[int, bool, bytes]] = {}
        for seqno in range(1, high + 1):
            key, deleted, value = log[seqno]
            expected[key] = (seqno, deleted, value)
        replayed: dict[bytes, tuple[int, bool, bytes]] = {}
        for items in parts:
            assert len({k for k, *_ in items}) == len(items), "a part holds each key once"
            assert [s for _k, s, _d, _v in items] == sorted(s for _k, s, _d, _v in items)
            for key, seqno, deleted, value in items:
                assert log[seqno] == (key, deleted, value)
                replayed[key] = (seqno, deleted, value)
        assert replayed == expected, f"snapshot at {high} is not the state at {high}"
