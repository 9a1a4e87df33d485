"""A replica rolled back by undo (``Engine.undo_replica``), on real LMDB: it ends with the
by-seqno history it had at the rollback seqno, item for item (seqno, cas, rev, deleted, value),
with that state's live count, failover log and resume position, survives a reopen, takes the
stream on from there, and refuses (changing nothing) when a version it needs is gone."""
from __future__ import annotations

import pytest

from engine.cluster.replica_rollback import Resync, Undo
from engine.core.replica_snapshots import SnapshotMark
from engine.core.types import FailoverEntry, Item, Op, PartitionState, WriteOp

P = 0


def keys_in(engine, n: int) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        if engine.partition_of(f"key-{i}") == P:
            out.append(f"key-{i}")
        i += 1
    return out


def scan(engine) -> list[tuple]:
    with engine.snapshot(P, 0) as snap:
        return [tuple(item) for item in snap.items()]


def write(engine, ops) -> None:
    for op, key, value in ops:
        engine.write(WriteOp(op, key, value))


def history_then_more(engine, flush_between: bool = True):
    """Ten keys (three rewritten, one deleted) up to S, then rewrites, a delete, a re-delete of
    nothing, new keys and a rewrite twice above S; returns (S, the scan at S, live items at S)."""
    ks = keys_in(engine, 14)
    write(engine, [(Op.MUTATION, k, b"one") for k in ks[:10]])
    write(engine, [(Op.MUTATION, k, b"two") for k in ks[:3]])
    write(engine, [(Op.DELETION, ks[9], b"")])
    engine.flush_now()
    s, at_s, live = engine.high_seqno(P), scan(engine), engine.stats(P).item_count
    more = [(Op.MUTATION, ks[0], b"three"), (Op.MUTATION, ks[3], b"two"), (Op.DELETION, ks[4], b""),
            (Op.MUTATION, ks[9], b"back"), (Op.MUTATION, ks[10], b"new"), (Op.MUTATION, ks[11], b"new")]
    for op in more:
        write(engine, [op])
        if flush_between:
            engine.flush_now()
    write(engine, [(Op.MUTATION, ks[3], b"three")])  # a second version above S, in the same flush
    write(engine, [(Op.DELETION, ks[10], b"")])
    return s, at_s, live


def test_undo_restores_the_history_at_the_rollback_seqno(make_engine) -> None:
    engine = make_engine()
    s, at_s, live = history_then_more(engine)
    engine.set_state(P, PartitionState.REPLICA)
    engine.adopt_failover_log(P, (FailoverEntry(9, s + 2), FailoverEntry(7, 0)))
    result = engine.undo_replica(P, s)
    assert isinstance(result.plan, Undo), result.plan
    assert scan(engine) == at_s
    assert engine.high_seqno(P) == engine.persisted_seqno(P) == s
    assert engine.stats(P).item_count == live
    assert engine.failover_log(P) == (FailoverEntry(7, 0),)
    assert engine.replica_mark(P) == (s, SnapshotMark(s, s, s))
    for key, seqno, cas, rev, deleted, value in at_s:
        if not deleted:
            doc = engine.get(key.decode())
            assert (doc.seqno, doc.cas, doc.rev, doc.value) == (seqno, cas, rev, value)
    # the stream goes on from S: the copy takes the active's next snapshot
    engine.replica_marker(P, s + 1, s + 1)
    engine.apply_replicated(P, [Item(at_s[0][0], s + 1, at_s[-1][2] + 10, at_s[0][3] + 1, False, b"active")],
                            last=True)
    engine.flush_now()
    assert scan(engine)[-1][:2] == (at_s[0][0], s + 1)


def test_the_undo_survives_a_reopen(make_engine, tmp_path) -> None:
    engine = make_engine()
    s, at_s, live = history_then_more(engine)
    engine.set_state(P, PartitionState.REPLICA)
    assert isinstance(engine.undo_replica(P, s).plan, Undo)
    engine.close()
    again = make_engine()
    assert scan(again) == at_s
    assert again.high_seqno(P) == s and again.stats(P).item_count == live
    assert again.replica_mark(P) == (s, SnapshotMark(s, s, s))


def test_a_missing_version_means_a_resync_and_nothing_changes(make_engine) -> None:
    engine = make_engine()
    k = keys_in(engine, 1)[0]
    write(engine, [(Op.MUTATION, k, b"one")])
    engine.flush_now()
    write(engine, [(Op.MUTATION, k, b"two")])  # rev 2 at seqno 2, dropped from the queue by rev 3
    write(engine, [(Op.MUTATION, k, b"three")])
    engine.flush_now()
    engine.set_state(P, PartitionState.REPLICA)
    before = scan(engine), engine.high_seqno(P), engine.stats(P).item_count
    result = engine.undo_replica(P, 2)
    assert isinstance(result.plan, Resync) and "missing" in result.plan.reason
    assert (scan(engine), engine.high_seqno(P), engine.stats(P).item_count) == before


def test_a_key_rewritten_above_the_seqno_before_a_flush_cannot_be_proven(make_engine) -> None:
    """The queue keeps one version per key, so two versions above S flushed together leave a rev
    gap that looks like a lost version at S: the undo refuses rather than guess."""
    engine = make_engine()
    s, _at_s, _live = history_then_more(engine, flush_between=False)
    engine.set_state(P, PartitionState.REPLICA)
    result = engine.undo_replica(P, s)
    assert isinstance(result.plan, Resync) and "missing" in result.plan.reason


def test_too_large_an_undo_is_a_resync(make_engine) -> None:
    from engine.replica_undo import undo_above

    engine = make_engine()
    ks = keys_in(engine, 5)
    write(engine, [(Op.MUTATION, k, b"one") for k in ks])
    engine.set_state(P, PartitionState.REPLICA)
    engine.flush_now()
    result = undo_above(engine._store, engine._turn, P, 2, live_items=5, purge_seqno=0, max_cas=0,
                        failover_log=(), max_items=2)
    assert isinstance(result.plan, Resync) and "undo limit" in result.plan.reason


def latest_per_key(rows: list[tuple]) -> list[tuple]:
    """A scan as the partition's state: each key's newest version (a scan's disk and memory parts
    may both hold a key), in seqno order."""
    newest: dict[bytes, tuple] = {}
    for row in rows:
        if row[0] not in newest or row[1] > newest[row[0]][1]:
            newest[row[0]] = row
    return sorted(newest.values(), key=lambda row: row[1])


@pytest.mark.parametrize("seed", range(10))
def test_an_undo_is_exact_or_refused_over_random_histories(make_engine, seed: int) -> None:
    """Random sets, deletes, flushes and purges; the state seen at a random seqno S is what an
    undo to S restores (item for item, live count too), or the undo refuses and changes nothing."""
    import random

    rng = random.Random(seed)
    engine = make_engine()
    keys = keys_in(engine, 12)
    live: set[str] = set()
    states: dict[int, tuple[list[tuple], int]] = {0: ([], 0)}
    for _ in range(rng.randint(20, 60)):
        key = rng.choice(keys)
        if key in live and rng.random() < 0.3:
            write(engine, [(Op.DELETION, key, b"")])
            live.discard(key)
        else:
            write(engine, [(Op.MUTATION, key, b"v%d" % rng.randint(0, 9))])
            live.add(key)
        if rng.random() < 0.75:
            engine.flush_now()
        if rng.random() < 0.02:
            engine.flush_now()
            engine.compact()  # purges the persisted tombstones
        states[engine.high_seqno(P)] = (latest_per_key(scan(engine)), engine.stats(P).item_count)
    engine.set_state(P, PartitionState.REPLICA)
    seqno = rng.choice(sorted(states))
    before = latest_per_key(scan(engine)), engine.high_seqno(P)
    result = engine.undo_replica(P, seqno)
    if isinstance(result.plan, Undo):
        at_s, live_at_s = states[seqno]
        now = scan(engine)
        assert [row for row in now if not row[4]] == [row for row in at_s if not row[4]]
        # a purge after S removed tombstones, which an undo does not bring back
        assert {row for row in now if row[4]} <= {row for row in at_s if row[4]}
        assert engine.stats(P).item_count == live_at_s and engine.high_seqno(P) == seqno
    else:
        assert (latest_per_key(scan(engine)), engine.high_seqno(P)) == before
