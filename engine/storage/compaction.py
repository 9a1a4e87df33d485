"""Compaction: rewriting a partition's blocks without their stale entries, in bounded steps.

Couchstore semantics (a by-seqno scan yields each live key's latest version once): when a key is
rewritten, the flusher's ``Cursor.replace`` on the by-key tree returns the old record, whose
seqno is marked stale in ``x<p>`` in the same transaction; readers drop marked entries, and
compaction rewrites the blocks without them once they outnumber the live entries (or small
blocks are many), a bounded step per flush.  A stale entry is therefore never visible, and disk
space held by superseded values is bounded by about the live data (plus ``COMPACT_MIN_STALE``
entries).

WHY marks and passes rather than cutting an item out at each rewrite: cutting one superseded
item out of its block at once would copy a whole block per rewritten key; marking it stale costs
one small-tree entry, and a compaction pass copies about two items per stale one.  A pass runs
in bounded steps, one per flush, so neither a flush's latency nor its transaction's memory grows
with the partition.

The counts that decide when a pass runs (stale marks, small blocks, where a pass resumes) are
kept per partition as committed and as the open write transaction will commit them, so a
transaction re-run after ``MapFullError`` never counts twice (``Store.write`` drives
``begin``/``commit``/``abort``).
"""
from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from itertools import repeat

import lmdb

from engine.storage import blocks
from engine.storage.blocks import (
    BLOCK_HEADER,
    ColsBuffer,
    block_span,
    compress_cols,
    decode_block,
    is_small,
    split_blocks,
)
from engine.storage.records import SEQNO
from engine.storage.stale_marks import StaleMarks

#: Compaction runs when a partition's stale entries exceed max(this, its live entries) ...
COMPACT_MIN_STALE = 4096
#: ... or its small blocks exceed max(this, entries // 64) (many small flushes: single persisted writes).
COMPACT_MIN_BLOCKS = 512
#: A compaction pass advances by about this many bytes of source values per flush.
COMPACT_STEP_BYTES = 4 << 20

#: (stale marks, small blocks, compaction resume key or None) of one partition.
Counts = tuple[int, int, bytes | None]


class Compaction:
    """Compaction of every partition of one store; used inside the store's write transactions."""

    __slots__ = ("_block_dbs", "_key_dbs", "_stale_dbs", "_committed", "_pending")

    def __init__(self, block_dbs: Sequence[object], key_dbs: Sequence[object], stale_dbs: Sequence[object]) -> None:
        self._block_dbs = block_dbs
        self._key_dbs = key_dbs
        self._stale_dbs = stale_dbs
        # counts per partition as committed (None: not read yet), and the counts the open write
        # transaction will commit
        self._committed: list[Counts | None] = [None] * len(block_dbs)
        self._pending: dict[int, Counts] = {}

    # ------------------------------------------------------------------ transaction discipline

    def begin(self) -> None:
        """A write transaction starts (or restarts after ``MapFullError``)."""
        self._pending.clear()

    def commit(self) -> None:
        """The write transaction committed: its counts become the committed ones."""
        for p, counts in self._pending.items():
            self._committed[p] = counts
        self._pending.clear()

    def abort(self) -> None:
        self._pending.clear()

    def forget(self, p: int) -> None:
        """Partition ``p`` was emptied in the open transaction: it has no marks, blocks or pass."""
        self._pending[p] = (0, 0, None)

    def _counts(self, txn: lmdb.Transaction, p: int) -> Counts:
        """Counts of partition ``p`` in this transaction.  At the first flush after open the
        marks are counted by LMDB; small blocks are counted from then on (an estimate that only
        decides when to merge them)."""
        return self._pending.get(p) or self._committed[p] or (txn.stat(self._stale_dbs[p])["entries"], 0, None)

    # ------------------------------------------------------------------ flushes

    def after_flush(self, txn: lmdb.Transaction, p: int, stale: list[bytes], small_blocks: int, *,
                    step: bool = True) -> None:
        """Mark ``stale`` (by-key records' seqno prefixes the flush superseded) and run a bounded
        compaction step when one is due (a pass under way, or too many marks or small blocks)
        and ``step`` (False: a slice of a flush whose last slice steps)."""
        marks, small, resume = self._counts(txn, p)
        if stale:
            stale.sort()
            txn.cursor(self._stale_dbs[p]).putmulti(zip(stale, repeat(b"")))
            marks += len(stale)
        small += small_blocks
        self._pending[p] = (marks, small, resume)
        if not step:
            return
        if resume is not None:
            self.step(txn, p, resume, COMPACT_STEP_BYTES)
        elif marks > COMPACT_MIN_STALE or small > COMPACT_MIN_BLOCKS:
            entries = txn.stat(self._key_dbs[p])["entries"]
            if marks > max(COMPACT_MIN_STALE, entries) or small > max(COMPACT_MIN_BLOCKS, entries // 64):
                self.step(txn, p, None, COMPACT_STEP_BYTES)

    # ------------------------------------------------------------------ a step

    def step(self, txn: lmdb.Transaction, p: int, resume: bytes | None, budget: int | None,
             should_purge: Callable[[int, int], bool] | None = None) -> tuple[int, bytes | None]:
        """One compaction step over partition ``p``'s blocks from ``resume`` (None: the first):
        drop stale entries (and, with ``should_purge``, the tombstones it selects), merge small
        blocks, delete the stale marks visited.  Stops after about ``budget`` bytes of source
        values (None: at the end).  Returns (highest purged seqno, where to resume or None).

        A block whose items are all stale is dropped undecoded, and a large block with nothing to
        drop stays where it is.  The new blocks' keys fall within the range their source blocks
        covered, so they never collide with blocks not yet visited."""
        bdb, xdb, kdb = self._block_dbs[p], self._stale_dbs[p], self._key_dbs[p]
        marks, small, _ = self._counts(txn, p)
        from_start = resume is None
        cur = txn.cursor(bdb)
        ok = cur.set_range(resume) if resume is not None else cur.first()
        if not ok:
            self._pending[p] = (marks, max(small, 0), None)
            return 0, None
        walker = StaleMarks(txn, xdb, int.from_bytes(cur.key(), "big"))
        visited: list[array] = []  # marks to delete once the walk is over
        highest = 0
        source: list[bytes] = []
        acc = ColsBuffer()
        chunk = 0
        spent = 0
        while ok:
            k, blob = cur.item()
            n, klen, vlen = BLOCK_HEADER.unpack_from(blob)
            dead = walker.between(*block_span(k, blob)[1:])
            if dead:
                visited.append(dead)
                marks -= len(dead)
            o = BLOCK_HEADER.size + 32 * n
            purge_here = should_purge is not None and b"\x01" in blob[o : o + n]
            was_small = is_small(n, vlen)
            if len(dead) == n:
                source.append(k)  # every item superseded: drop it undecoded
                small -= was_small
            elif not dead and not purge_here and not was_small:
                if source or len(acc):  # leave this block: first write out what precedes it
                    small += _replace_blocks(txn, bdb, source, acc)
                    source, acc, chunk = [], ColsBuffer(), 0
                    cur.set_key(k)
            else:
                cols = decode_block(blob)
                if dead or purge_here:
                    gone = set(dead)
                    keys, seqnos, cas, _revs, deleted, _values = cols
                    keep = [s not in gone for s in seqnos]
                    if purge_here:
                        for i, d in enumerate(deleted):
                            if d and keep[i] and should_purge(seqnos[i], cas[i]):  # type: ignore[misc]
                                keep[i] = False
                                txn.delete(keys[i], db=kdb)  # a live entry: its by-key record is this one
                                highest = max(highest, seqnos[i])
                    cols = compress_cols(cols, keep)
                source.append(k)
                small -= was_small
                acc.extend(cols)
                chunk += vlen
            spent += vlen
            ok = cur.next()
            if ok and (chunk >= 4 * blocks.BLOCK_VALUE_BYTES or (budget is not None and spent >= budget)):
                resume = cur.key()
                small += _replace_blocks(txn, bdb, source, acc)
                source, acc, chunk = [], ColsBuffer(), 0
                if budget is not None and spent >= budget:
                    _delete_marks(txn, xdb, visited)
                    self._pending[p] = (marks, max(small, 0), resume)
                    return highest, resume
                ok = cur.set_range(resume)
        small += _replace_blocks(txn, bdb, source, acc)
        if from_start:
            txn.drop(xdb, delete=False)  # a whole pass visited every mark
            marks = 0
        else:
            _delete_marks(txn, xdb, visited)
        self._pending[p] = (marks, max(small, 0), None)
        return highest, None


def _replace_blocks(txn: lmdb.Transaction, bdb: object, source: list[bytes], acc: ColsBuffer) -> int:
    """Delete the ``source`` blocks and write ``acc`` as new blocks; returns how many of those
    are small."""
    for k in source:
        txn.delete(k, db=bdb)
    if not len(acc):
        return 0
    small = 0
    for record_key, blob in split_blocks(*acc.columns()):
        txn.put(record_key, blob, db=bdb)
        n, _klen, vlen = BLOCK_HEADER.unpack_from(blob)
        small += is_small(n, vlen)
    return small


def _delete_marks(txn: lmdb.Transaction, xdb: object, visited: list[array]) -> None:
    """Delete the stale marks a compaction step visited (C-level map, no bytecode per mark)."""
    delete = partial(txn.delete, db=xdb)
    for marks in visited:
        deque(map(delete, map(SEQNO.pack, marks)), maxlen=0)
