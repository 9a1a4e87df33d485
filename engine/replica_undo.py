"""A replica copy rolled back by undo: its history above a seqno cut off in one LMDB transaction.

What to restore, and when an undo cannot be exact, is ``engine.cluster.replica_rollback``'s
decision; this module reads what that decision needs from the store and carries it out:

1. read the versions above ``S`` (whole blocks past ``S``, the tail of the block that crosses
   it; stale versions too, since a key's *first* version above ``S`` is what its rev is checked
   against), counting them first from the block headers so a too-large undo reads nothing more;
2. walk the history at or below ``S`` backwards for those keys' last versions, stale ones
   included, until each key of rev > 1 is found (a key of rev 1 needs the whole walk, bounded
   by ``MAX_SEARCH_ITEMS``);
3. if the plan is an ``Undo``, in the same transaction: delete the blocks past ``S`` and rewrite
   the crossing one without its tail; delete the stale marks past ``S``, and those of the
   versions restored (they are current again); put each key's restored by-key record (or
   delete it); store the persisted seqno ``S`` with the live count moved by the keys' changes,
   the snapshot mark ``(S, S, S)`` (``S`` is a whole state now), the purge seqno capped at ``S``
   and the failover log cut to the entries at or below ``S``.

The caller (``Engine.undo_replica``) holds the writer lock and has flushed the partition, so the
queue holds nothing unpersisted and the store is the whole copy.  Holding the lock (and the LMDB
turn) for the walk keeps a purge or a flush from changing the blocks between reading and
writing them; the walk is bounded by ``MAX_SEARCH_ITEMS`` (about half a second of CPU at the
limit: ``bench/replica_undo.py`` reads 100,000 items in well under a tenth of one).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import lmdb

from engine.cluster.replica_rollback import MAX_SEARCH_ITEMS, MAX_UNDO_ITEMS, Resync, Undo, Version, plan_undo
from engine.core import failover
from engine.core.replica_snapshots import SnapshotMark
from engine.storage.blocks import block_span, decode_block, encode_block, seek_block
from engine.storage.records import META, SEQNO
from engine.storage.store import Store

__all__ = ["UndoResult", "undo_above"]


@dataclass(frozen=True, slots=True)
class UndoResult:
    """What the transaction did: ``plan`` (``Undo`` applied, or ``Resync``: nothing changed),
    and after an undo the partition's new live count, purge seqno and failover log."""

    plan: Undo | Resync
    live_items: int = 0
    purge_seqno: int = 0
    failover_log: failover.FailoverLog = ()


def undo_above(store: Store, turn: threading.Lock, partition: int, seqno: int, *, live_items: int,
               purge_seqno: int, max_cas: int, failover_log: failover.FailoverLog, max_items: int = MAX_UNDO_ITEMS,
               max_search: int = MAX_SEARCH_ITEMS) -> UndoResult:
    """Roll partition ``partition``'s persisted history back to ``seqno`` (see the module doc).
    ``live_items``, ``purge_seqno``, ``max_cas``, ``failover_log``: the partition's persisted
    figures now (the highest CAS is kept as it is: CAS must keep increasing on a copy that may
    be promoted, whatever was cut off)."""

    def work(txn: lmdb.Transaction) -> UndoResult:
        with turn:  # a run of LMDB calls (``engine.flusher.lmdb_turn``); never held across the commit
            return _undo(store, txn, partition, seqno, live_items, purge_seqno, max_cas, failover_log, max_items,
                         max_search)

    return store.write(work)


def _undo(store: Store, txn: lmdb.Transaction, p: int, seqno: int, live_items: int, purge_seqno: int, max_cas: int,
          log: failover.FailoverLog, max_items: int, max_search: int) -> UndoResult:
    bdb, kdb, xdb = store.block_dbs[p], store.key_dbs[p], store.stale_dbs[p]
    cur = txn.cursor(bdb)
    above_key = SEQNO.pack(seqno + 1)
    # the block crossing ``seqno`` (starts at or below it, ends above it), then the blocks past it
    crossing: bytes | None = None
    if seek_block(cur, above_key) and int.from_bytes(cur.key(), "big") <= seqno:
        _n, _first, last = block_span(cur.key(), cur.value())
        if last > seqno:
            crossing = cur.key()
    past: list[bytes] = []
    items_above = 0
    if crossing is not None:
        blob = txn.get(crossing, db=bdb)
        items_above += sum(1 for s in decode_block(blob)[1] if s > seqno)
    ok = cur.set_range(above_key)
    while ok:
        past.append(cur.key())
        items_above += block_span(cur.key(), cur.value())[0]
        ok = cur.next()
    if items_above > max_items:
        return UndoResult(plan_undo(seqno, {}, {}, items_above=items_above, searched_all=False, max_items=max_items))

    # 1. each key's first version above ``seqno``
    first_above: dict[bytes, Version] = {}
    for key in ([crossing] if crossing is not None else []) + past:
        keys, seqnos, cas, revs, deleted, _values = decode_block(txn.get(key, db=bdb))
        for i, s in enumerate(seqnos):
            if s > seqno and keys[i] not in first_above:
                first_above[keys[i]] = Version(s, cas[i], revs[i], bool(deleted[i]))

    # 2. their last versions at or below it, walking back
    last_below: dict[bytes, Version] = {}
    wanted_rev = {k for k, v in first_above.items() if v.rev != 1}
    need_all = len(wanted_rev) != len(first_above)
    searched = 0
    searched_all = True
    ok = seek_block(cur, SEQNO.pack(seqno)) and (wanted_rev or need_all)
    if ok and int.from_bytes(cur.key(), "big") > seqno:
        ok = cur.prev()  # the tree's first block starts above ``seqno``: nothing below it
    while ok:
        keys, seqnos, cas, revs, deleted, _values = decode_block(cur.value())
        for i in range(len(seqnos) - 1, -1, -1):
            s = seqnos[i]
            if s > seqno:
                continue
            searched += 1
            k = keys[i]
            if k in first_above and k not in last_below:
                last_below[k] = Version(s, cas[i], revs[i], bool(deleted[i]))
                wanted_rev.discard(k)
        if not wanted_rev and not need_all:
            searched_all = False  # stopped early: every key it had to find was found
            break
        if searched > max_search:
            searched_all = False
            break
        ok = cur.prev()

    plan = plan_undo(seqno, first_above, last_below, items_above=items_above, searched_all=searched_all,
                     max_items=max_items)
    if isinstance(plan, Resync):
        return UndoResult(plan)

    # 3. carry it out
    if crossing is not None:
        keys, seqnos, cas, revs, deleted, values = decode_block(txn.get(crossing, db=bdb))
        n = sum(1 for s in seqnos if s <= seqno)
        txn.put(crossing, encode_block(keys[:n], seqnos[:n], cas[:n], revs[:n], deleted[:n], values[:n]), db=bdb)
    for key in past:
        txn.delete(key, db=bdb)
    marks = txn.cursor(xdb)
    stale_past: list[bytes] = []
    ok = marks.set_range(above_key)
    while ok:
        stale_past.append(marks.key())
        ok = marks.next()
    for key in stale_past:
        txn.delete(key, db=xdb)
    live = live_items
    for key, version in plan.restore.items():
        record = txn.get(key, db=kdb)
        if record is not None and not META.unpack(record)[3]:
            live -= 1
        if version is None:
            txn.delete(key, db=kdb)
            continue
        txn.put(key, META.pack(version.seqno, version.cas, version.rev, version.deleted), db=kdb)
        txn.delete(SEQNO.pack(version.seqno), db=xdb)
        if not version.deleted:
            live += 1
    store.compaction.forget(p)  # its counts and any pass under way described the blocks cut off
    purge = min(purge_seqno, seqno)
    kept = failover.prune_above(log, seqno)
    store.put_persisted(txn, p, seqno, live, max_cas)
    store.put_snapshot(txn, p, SnapshotMark(seqno, seqno, seqno))
    store.put_purge(txn, p, purge)
    store.put_failover(txn, p, kept)
    return UndoResult(plan, live, purge, kept)

