"""The on-disk half of the engine: one LMDB environment holding every partition.

Layout (named databases; ``N`` partitions fixed when the data dir is created; format "2")::

    meta             format, partitions, node_id, clean marker,
                     state/<p>, persisted/<p> (seqno, live items, max cas), purge/<p>, failover/<p>
    b<p>  by-seqno   first seqno(8, big-endian)  ->  block: a run of consecutive persisted items
    k<p>  by-key     key  ->  seqno(8, big-endian) + cas(8) + rev(8) + deleted(1)
    x<p>  stale      seqno(8, big-endian)  ->  b""   (a block entry superseded by a newer version)

A **block** holds the items one flush wrote for the partition (at most ``BLOCK_ITEMS`` items and
about ``BLOCK_VALUE_BYTES`` of values), laid out as columns, little-endian::

    n u32, keys-blob bytes u32, values-blob bytes u64,
    seqnos u64[n], cas u64[n], revs u64[n], value ends u64[n] (offsets in the block), deleted u8[n],
    keys blob (keys joined by 0xFF, a byte UTF-8 never contains), values blob

WHY blocks: a by-seqno scan feeds the stream's column encoder, and with one LMDB record per
item the scan paid per item for the cursor step, two copies, a key slice and a metadata
unpack (~470 ns, 44 % of a raw cursor walk).  A block's numeric columns load with one
``array.frombytes`` each (a memcpy), its keys with one ``bytes.split``, so the per-item work left
is one slice per value.  The flusher gains too: one ``put`` per block instead of a tuple, a
concatenation and a B-tree insert per item.

Couchstore semantics (a by-seqno scan yields each live key's latest version once): when a key is
rewritten, ``Cursor.replace`` on the by-key tree returns the old record, whose seqno is marked
stale in ``x<p>`` in the same transaction; readers drop marked entries, and a compaction
(``Store._compact``) rewrites the blocks without them once they outnumber the live entries (or
small blocks are many), a bounded step per flush.  A stale entry is therefore never visible, and disk space held by
superseded values is bounded by about the live data (plus ``COMPACT_MIN_STALE`` entries).

Discipline: every transaction in ``with``; all write transactions go through ``write`` (one
at a time, grown on ``MapFullError``); read transactions are short, except a snapshot's disk
part, which holds one for as long as its reader streams.  Growing the map needs every read
transaction of the process closed, so readers pass through a small gate (``read_txn``).
"""
from __future__ import annotations

import fcntl
import os
import struct
import sys
import threading
import uuid as uuidlib
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, compress, islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import TypeVar

import lmdb

from engine.core import failover
from engine.core.errors import InvalidInput, UprError
from engine.core.types import FailoverEntry, Item, PartitionState

FORMAT = b"2"
#: seqno, cas, rev, deleted: the by-key record.
META = struct.Struct(">QQQ?")
META_SIZE = META.size
SEQNO = struct.Struct(">Q")
_PERSISTED = struct.Struct(">QQQ")
_tuple_new = tuple.__new__
_seqno_of = itemgetter(slice(0, 8))  # of a by-key record
_deleted_of = itemgetter(24)

#: Most items one block holds (a flush writes bigger runs as several blocks; compaction merges
#: small blocks up to this size).
BLOCK_ITEMS = 1024
#: A block closes once its values would pass this many bytes (one bigger value travels alone).
BLOCK_VALUE_BYTES = 64 << 10
#: Compaction runs when a partition's stale entries exceed max(this, its live entries) ...
COMPACT_MIN_STALE = 4096
#: ... or its small blocks exceed max(this, entries // 64) (many small flushes: single persisted writes).
COMPACT_MIN_BLOCKS = 512
#: A compaction pass advances by about this many bytes of source values per flush.
COMPACT_STEP_BYTES = 4 << 20
KEY_SEP = b"\xff"
_BLOCK_HEADER = struct.Struct("<IIQ")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
#: Stale marks read per window by ``StaleMarks``.
MARK_WINDOW = 1 << 14
_BIG_ENDIAN = sys.byteorder == "big"
assert array("Q").itemsize == 8

T = TypeVar("T")
Cols = tuple  # (keys, seqnos, cas, revs, deleted, values): one block's columns


class DataDirInUse(UprError):
    """Raised by ``Engine.open`` only (never by a request): the data dir is held by another engine.

    Lives here rather than in ``engine.core.errors`` because it is a start-up failure, not part of
    the request error contract that the HTTP and stream layers map."""

    code = "data_dir_in_use"


class IncompatibleDataDir(InvalidInput):
    """Raised by ``Engine.open`` only: the data dir was written in another storage format.

    A subclass of ``InvalidInput`` (what an unknown format raised before format 2).  The engine never converts a data dir in place (a half-converted store would be worse than
    a refused one); restore a backup into a new data dir instead."""

    code = "data_dir_format"


class CorruptStore(UprError):
    """The by-key and by-seqno trees disagree or a block does not decode: the store is damaged."""

    code = "corrupt_store"


# ---------------------------------------------------------------------- blocks


def encode_block(keys: Sequence[bytes], seqnos: Sequence[int], cas: Sequence[int], revs: Sequence[int],
                 deleted: Sequence[int], values: Sequence[bytes]) -> bytes:
    """One block for a non-empty run of items in seqno order (columns as in the module doc)."""
    n = len(values)
    kblob = KEY_SEP.join(keys)
    base = _BLOCK_HEADER.size + 33 * n + len(kblob)  # where the values blob starts
    vends = array("Q", accumulate(map(len, values), initial=base))
    del vends[0]
    cols = [array("Q", seqnos), array("Q", cas), array("Q", revs), vends]
    if _BIG_ENDIAN:  # pragma: no cover - little-endian machines only in CI
        for col in cols:
            col.byteswap()
    return b"".join((_BLOCK_HEADER.pack(n, len(kblob), vends[-1] - base), *cols, bytes(deleted), kblob, *values))


def decode_block(blob: bytes) -> Cols:
    """(keys list, seqnos, cas, revs as ``array('Q')``, deleted bytes (0/1), values list)."""
    n, klen, vlen = _BLOCK_HEADER.unpack_from(blob)
    o = _BLOCK_HEADER.size + 32 * n
    nums = array("Q")
    nums.frombytes(memoryview(blob)[_BLOCK_HEADER.size : o])  # the four u64 columns in one copy
    if _BIG_ENDIAN:  # pragma: no cover
        nums.byteswap()
    vends = nums[3 * n :]
    deleted = blob[o : o + n]
    o += n
    keys = blob[o : o + klen].split(KEY_SEP)
    o += klen
    if len(keys) != n or o + vlen != len(blob) or (n and vends[-1] != len(blob)):
        raise CorruptStore(f"block of {n} items at seqno {nums[0] if n else '?'} does not decode")
    starts = array("Q", (o,))
    starts += vends[:-1]
    values = list(map(blob.__getitem__, map(slice, starts, vends)))  # no copy of the values region
    return keys, nums[:n], nums[n : 2 * n], nums[2 * n : 3 * n], deleted, values


def block_span(key: bytes, blob: bytes) -> tuple[int, int, int]:
    """(items, first seqno, last seqno) of a block without decoding it."""
    n = _U32.unpack_from(blob)[0]
    return n, int.from_bytes(key, "big"), _U64.unpack_from(blob, _BLOCK_HEADER.size + 8 * (n - 1))[0]


class StaleMarks:
    """The stale marks of one partition from a seqno on, read forward a window at a time (one
    C-level cursor walk and one ``array`` per window), asked for by ascending block ranges."""

    __slots__ = ("_walk", "_marks", "_pos", "_more")

    def __init__(self, txn: lmdb.Transaction, db: object, start: int) -> None:
        cur = txn.cursor(db)
        self._more = cur.set_range(SEQNO.pack(start))
        self._walk = cur.iternext(keys=True, values=False)
        self._marks = array("Q")
        self._pos = 0

    def between(self, first: int, last: int) -> array:
        """The marks in ``[first, last]`` (ascending calls: never below a previous ``last``)."""
        marks = self._marks
        while self._more and (len(marks) == self._pos or marks[-1] <= last):
            chunk = b"".join(islice(self._walk, MARK_WINDOW))
            if len(chunk) < 8 * MARK_WINDOW:
                self._more = False
            window = array("Q")
            window.frombytes(chunk)
            if not _BIG_ENDIAN:
                window.byteswap()  # the keys are big-endian
            marks = self._marks = marks[self._pos :] + window
            self._pos = 0
        lo = bisect_left(marks, first, self._pos)
        hi = bisect_right(marks, last, lo)
        self._pos = hi
        return marks[lo:hi]


def _block_value(blob: bytes, seqno: int) -> bytes | None:
    """The value of ``seqno`` in ``blob`` without decoding the rest; None if it is not there."""
    n, klen, _vlen = _BLOCK_HEADER.unpack_from(blob)
    o = _BLOCK_HEADER.size
    seqnos = array("Q")
    seqnos.frombytes(memoryview(blob)[o : o + 8 * n])
    if _BIG_ENDIAN:  # pragma: no cover
        seqnos.byteswap()
    i = bisect_left(seqnos, seqno)
    if i == n or seqnos[i] != seqno:
        return None
    ends = o + 24 * n
    start = _U64.unpack_from(blob, ends + 8 * (i - 1))[0] if i else o + 33 * n + klen
    return blob[start : _U64.unpack_from(blob, ends + 8 * i)[0]]


def _blocks(keys: Sequence[bytes], seqnos: Sequence[int], cas: Sequence[int], revs: Sequence[int],
            deleted: Sequence[int], values: Sequence[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """(by-seqno key, block) records for a run of items, cut by ``BLOCK_ITEMS``/``BLOCK_VALUE_BYTES``."""
    n = len(seqnos)
    if n <= BLOCK_ITEMS and sum(map(len, values)) <= BLOCK_VALUE_BYTES:
        yield SEQNO.pack(seqnos[0]), encode_block(keys, seqnos, cas, revs, deleted, values)
        return
    sizes = list(accumulate(map(len, values)))
    a = 0
    base = 0
    while a < n:
        b = min(a + BLOCK_ITEMS, n)
        b = max(a + 1, min(b, bisect_right(sizes, base + BLOCK_VALUE_BYTES, a, b)))
        yield SEQNO.pack(seqnos[a]), encode_block(keys[a:b], seqnos[a:b], cas[a:b], revs[a:b], deleted[a:b],
                                                  values[a:b])
        base = sizes[b - 1]
        a = b


def _is_small(n: int, value_bytes: int) -> bool:
    """A block worth merging: under half full by items and by bytes."""
    return 2 * n < BLOCK_ITEMS and 2 * value_bytes < BLOCK_VALUE_BYTES


def compress_cols(cols: Cols, keep: Sequence[bool]) -> Cols:
    """The items of ``cols`` whose ``keep`` flag is true (C-level ``compress`` per column)."""
    keys, seqnos, cas, revs, deleted, values = cols
    return (list(compress(keys, keep)), array("Q", compress(seqnos, keep)), array("Q", compress(cas, keep)),
            array("Q", compress(revs, keep)), bytes(compress(deleted, keep)), list(compress(values, keep)))


class ColsBuffer:
    """Columns accumulated from several blocks (C-level extends)."""

    __slots__ = ("keys", "seqnos", "cas", "revs", "deleted", "values")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.seqnos = array("Q")
        self.cas = array("Q")
        self.revs = array("Q")
        self.deleted = bytearray()
        self.values: list[bytes] = []

    def extend(self, cols: Cols) -> None:
        keys, seqnos, cas, revs, deleted, values = cols
        self.keys += keys
        self.seqnos += seqnos
        self.cas += cas
        self.revs += revs
        self.deleted += deleted
        self.values += values

    def __len__(self) -> int:
        return len(self.seqnos)

    def columns(self) -> Cols:
        return self.keys, self.seqnos, self.cas, self.revs, bytes(self.deleted), self.values


def seek_block(cursor: lmdb.Cursor, first: bytes) -> bool:
    """Put ``cursor`` on the block that may hold seqno ``first`` (the last block starting at or
    before it, else the first block after it); False when the tree is empty."""
    if cursor.set_range(first):
        if cursor.key() != first:
            cursor.prev() or cursor.first()
        return True
    return cursor.last()


# ---------------------------------------------------------------------- store


@dataclass(slots=True)
class PartitionMeta:
    """What the meta database says about one partition at open."""

    state: PartitionState
    persisted_seqno: int
    live_items: int
    max_cas: int
    purge_seqno: int
    failover_log: failover.FailoverLog


@dataclass(slots=True)
class OpenResult:
    store: "Store"
    created: bool
    was_clean: bool
    partitions: list[PartitionMeta]


class _ReadGate:
    """Counts live read transactions so the map can be grown when none is open."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._resizing = False

    def enter(self) -> None:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._readers += 1

    def leave(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._resizing = True
            try:
                while self._readers:
                    self._cond.wait()
                yield
            finally:
                self._resizing = False
                self._cond.notify_all()


def _db_names(partition: int) -> tuple[bytes, bytes, bytes]:
    return b"b%d" % partition, b"k%d" % partition, b"x%d" % partition


class Store:
    """LMDB access for the engine; thread-safe (writes serialised, reads concurrent)."""

    def __init__(self, env: lmdb.Environment, partitions: int, node_id: str, map_size: int) -> None:
        self.env = env
        self.num_partitions = partitions
        self.node_id = node_id
        self.map_size = map_size
        self._write_lock = threading.Lock()
        self._gate = _ReadGate()
        self.meta_db = env.open_db(b"meta")
        self.block_dbs = []
        self.key_dbs = []
        self.stale_dbs = []
        for p in range(partitions):
            b, k, x = _db_names(p)
            self.block_dbs.append(env.open_db(b))
            self.key_dbs.append(env.open_db(k))
            self.stale_dbs.append(env.open_db(x))
        # (stale marks, small blocks, compaction resume key) per partition as committed (None: not read yet), and the values
        # the open write transaction will commit (applied by ``write`` after the commit only,
        # so a transaction re-run after MapFullError never counts twice)
        self._counts: list[tuple[int, int, bytes | None] | None] = [None] * partitions
        self._pending: dict[int, tuple[int, int, bytes | None]] = {}
        self.fsyncs = 0
        self._lock_fd: int | None = None

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(cls, data_dir: Path, partitions: int, map_size: int, failover_cap: int) -> OpenResult:
        """Open or create the environment; on open, record that the store is in use.

        A store opened without its clean marker was not closed cleanly: every partition gets a
        new failover entry (new uuid, persisted seqno), because the items that were only in
        memory are gone and their seqnos will be reused by a different history.
        """
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = _lock_data_dir(data_dir)
        try:
            return cls._open_locked(data_dir, partitions, map_size, failover_cap, lock_fd)
        except BaseException:
            os.close(lock_fd)
            raise

    @classmethod
    def _open_locked(cls, data_dir: Path, partitions: int, map_size: int, failover_cap: int,
                     lock_fd: int) -> OpenResult:
        stored = cls._stored_partitions(data_dir, map_size)
        count = stored if stored is not None else partitions
        if count < 1 or count > 4096:
            raise InvalidInput(f"partition count {count} is outside 1..4096", field="partitions")
        env = lmdb.open(
            str(data_dir), map_size=map_size, max_dbs=3 * count + 1, sync=True, metasync=True,
            max_readers=1024,
        )
        with env.begin(write=True) as txn:
            meta_db = env.open_db(b"meta", txn=txn)
            node_raw = txn.get(b"node_id", db=meta_db)
            created = node_raw is None
            stored_format = txn.get(b"format", db=meta_db)
            if created:
                node_raw = uuidlib.uuid4().hex.encode()
                txn.put(b"format", FORMAT, db=meta_db)
                txn.put(b"partitions", b"%d" % count, db=meta_db)
                txn.put(b"node_id", node_raw, db=meta_db)
        if not created and stored_format != FORMAT:
            env.close()
            found = stored_format.decode(errors="replace") if stored_format else "unknown"
            raise IncompatibleDataDir(
                f"data dir {data_dir} holds storage format {found}; this engine reads format "
                f"{FORMAT.decode()} only and does not convert in place: back it up with the version that "
                "wrote it (upr backup create) and restore into a new data dir", field="data_dir")
        store = cls(env, count, node_raw.decode(), map_size)
        store._lock_fd = lock_fd

        def start(txn: lmdb.Transaction) -> tuple[bool, list[PartitionMeta]]:
            was_clean = txn.get(b"clean", db=store.meta_db) is not None
            txn.delete(b"clean", db=store.meta_db)
            metas: list[PartitionMeta] = []
            for p in range(count):
                meta = store.read_partition_meta(txn, p)
                if created:
                    meta.failover_log = failover.add_entry((), FailoverEntry(failover.new_uuid(), 0), failover_cap)
                    store.put_state(txn, p, meta.state)
                    store.put_failover(txn, p, meta.failover_log)
                elif not was_clean or not meta.failover_log:
                    entry = FailoverEntry(failover.new_uuid(meta.failover_log), meta.persisted_seqno)
                    meta.failover_log = failover.add_entry(meta.failover_log, entry, failover_cap)
                    store.put_failover(txn, p, meta.failover_log)
                metas.append(meta)
            return was_clean, metas

        was_clean, metas = store.write(start)
        return OpenResult(store, created, was_clean or created, metas)

    @staticmethod
    def _stored_partitions(data_dir: Path, map_size: int) -> int | None:
        if not (data_dir / "data.mdb").exists():
            return None
        env = lmdb.open(str(data_dir), map_size=map_size, max_dbs=1, readonly=False)
        try:
            with env.begin() as txn:
                raw = txn.get(b"meta")
                if raw is None:
                    return None
            meta_db = env.open_db(b"meta", create=False)
            with env.begin() as txn:
                count = txn.get(b"partitions", db=meta_db)
            return int(count) if count is not None else None
        finally:
            env.close()

    def mark_clean(self) -> None:
        def put(txn: lmdb.Transaction) -> None:
            txn.put(b"clean", b"1", db=self.meta_db)

        self.write(put)

    def close(self) -> None:
        self.env.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # ------------------------------------------------------------------ transactions

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn`` in one write transaction (committed and fsynced on return).

        ``fn`` must be safe to re-run: on ``MapFullError`` the transaction is aborted, the map
        doubled and ``fn`` called again.
        """
        with self._write_lock:
            while True:
                self._pending.clear()
                try:
                    with self.env.begin(write=True) as txn:
                        result = fn(txn)
                except lmdb.MapFullError:
                    self._grow()
                    continue
                except BaseException:
                    self._pending.clear()
                    raise
                for p, counts in self._pending.items():
                    self._counts[p] = counts
                self._pending.clear()
                self.fsyncs += 1
                return result

    def _grow(self) -> None:
        with self._gate.exclusive():
            self.map_size *= 2
            self.env.set_mapsize(self.map_size)

    @contextmanager
    def read_txn(self) -> Iterator[lmdb.Transaction]:
        """A short read transaction."""
        self._gate.enter()
        try:
            with self.env.begin(buffers=False) as txn:
                yield txn
        finally:
            self._gate.leave()

    def begin_long_read(self) -> "LongRead":
        """A read transaction owned by a snapshot reader; the caller must ``close`` it."""
        self._gate.enter()
        try:
            txn = self.env.begin(buffers=False)
        except BaseException:
            self._gate.leave()
            raise
        return LongRead(self, txn)

    # ------------------------------------------------------------------ meta

    def read_partition_meta(self, txn: lmdb.Transaction, p: int) -> PartitionMeta:
        db = self.meta_db
        state_raw = txn.get(b"state/%d" % p, db=db)
        state = PartitionState(state_raw.decode()) if state_raw else PartitionState.ACTIVE
        pers = txn.get(b"persisted/%d" % p, db=db)
        persisted, live, max_cas = _PERSISTED.unpack(pers) if pers else (0, 0, 0)
        purge_raw = txn.get(b"purge/%d" % p, db=db)
        purge = SEQNO.unpack(purge_raw)[0] if purge_raw else 0
        log_raw = txn.get(b"failover/%d" % p, db=db)
        log = failover.decode(log_raw) if log_raw else ()
        return PartitionMeta(state, persisted, live, max_cas, purge, log)

    def persisted_seqno(self, txn: lmdb.Transaction, p: int) -> int:
        raw = txn.get(b"persisted/%d" % p, db=self.meta_db)
        return SEQNO.unpack_from(raw)[0] if raw else 0

    def put_state(self, txn: lmdb.Transaction, p: int, state: PartitionState) -> None:
        txn.put(b"state/%d" % p, state.value.encode(), db=self.meta_db)

    def put_failover(self, txn: lmdb.Transaction, p: int, log: failover.FailoverLog) -> None:
        txn.put(b"failover/%d" % p, failover.encode(log), db=self.meta_db)

    def put_purge(self, txn: lmdb.Transaction, p: int, seqno: int) -> None:
        txn.put(b"purge/%d" % p, SEQNO.pack(seqno), db=self.meta_db)

    def put_persisted(self, txn: lmdb.Transaction, p: int, seqno: int, live: int, max_cas: int) -> None:
        txn.put(b"persisted/%d" % p, _PERSISTED.pack(seqno, live, max_cas), db=self.meta_db)

    # ------------------------------------------------------------------ data

    def flush_items(self, txn: lmdb.Transaction, p: int, items: Sequence[Item]) -> tuple[int, int]:
        """Write ``items`` (ascending seqnos, each key once); return (live-count change, value bytes).

        ``Cursor.replace`` inserts the by-key record and hands back the old one in one B-tree
        walk; the old record's seqno is marked stale (one sorted ``putmulti`` into the small
        stale tree) instead of being cut out of its block.  The items themselves become a few
        blocks appended to the by-seqno tree: one ``put`` per block, not per item.
        """
        if not items:
            return 0, 0
        keys, seqnos, cas_, revs, deleted_, values = zip(*items)
        # C-level maps, no bytecode per item: pack each by-key record, replace it, keep the old
        # records that existed (bytes are truthy, None is not)
        replace = txn.cursor(self.key_dbs[p]).replace
        olds = list(filter(None, map(replace, keys, map(META.pack, seqnos, cas_, revs, deleted_))))
        delta = len(items) - sum(deleted_) - len(olds) + sum(map(_deleted_of, olds))
        stale = list(map(_seqno_of, olds))
        nbytes = sum(map(len, values))
        bdb = self.block_dbs[p]
        if len(items) <= BLOCK_ITEMS and nbytes <= BLOCK_VALUE_BYTES:  # the usual case: one block
            blocks = 1
            if not txn.put(SEQNO.pack(seqnos[0]), encode_block(keys, seqnos, cas_, revs, deleted_, values),
                           append=True, db=bdb):
                raise RuntimeError(f"by-seqno append rejected a block in partition {p}")
        else:  # one block at a time: a big flush never holds a second copy of all its values
            blocks = 0
            for record_key, blob in _blocks(keys, seqnos, cas_, revs, deleted_, values):
                if not txn.put(record_key, blob, append=True, db=bdb):
                    raise RuntimeError(f"by-seqno append rejected a block in partition {p}")
                blocks += 1
        marks, small, resume = self._pending.get(p) or self._counts[p] or self._read_counts(txn, p)
        if stale:
            stale.sort()
            txn.cursor(self.stale_dbs[p]).putmulti(zip(stale, repeat(b"")))
            marks += len(stale)
        if blocks == 1:
            small += _is_small(len(items), nbytes)
        self._pending[p] = (marks, small, resume)
        if resume is not None:
            self._compact(txn, p, resume, COMPACT_STEP_BYTES)
        elif marks > COMPACT_MIN_STALE or small > COMPACT_MIN_BLOCKS:
            entries = txn.stat(self.key_dbs[p])["entries"]
            if marks > max(COMPACT_MIN_STALE, entries) or small > max(COMPACT_MIN_BLOCKS, entries // 64):
                self._compact(txn, p, None, COMPACT_STEP_BYTES)
        return delta, nbytes

    def _read_counts(self, txn: lmdb.Transaction, p: int) -> tuple[int, int, bytes | None]:
        """(stale marks, small blocks, compaction resume key) of partition ``p`` at the first
        flush after open: marks counted by LMDB; small blocks are counted from then on (an
        estimate that only decides when to merge them)."""
        return txn.stat(self.stale_dbs[p])["entries"], 0, None

    def lookup(self, txn: lmdb.Transaction, p: int, key: bytes) -> tuple[int, int, int, bool] | None:
        """(seqno, cas, rev, deleted) of the persisted version of ``key``, or None."""
        raw = txn.get(key, db=self.key_dbs[p])
        return META.unpack(raw) if raw is not None else None

    def get_item(self, txn: lmdb.Transaction, p: int, key: bytes) -> Item | None:
        meta = txn.get(key, db=self.key_dbs[p])
        if meta is None:
            return None
        seqno, cas, rev, deleted = META.unpack(meta)
        cur = txn.cursor(self.block_dbs[p])
        value = _block_value(cur.value(), seqno) if seek_block(cur, meta[:8]) else None
        if value is None:
            raise CorruptStore(f"partition {p}: the by-key record of {key!r} names seqno {seqno}, "
                               "which no block holds", partition=p)
        return _tuple_new(Item, (key, seqno, cas, rev, deleted, value))

    def item_count(self, txn: lmdb.Transaction, p: int) -> int:
        """Live items and tombstones on disk (one by-key record each)."""
        return txn.stat(self.key_dbs[p])["entries"]

    def purge_tombstones(self, p: int, should_purge: Callable[[int, int], bool], purge_seqno: int) -> int:
        """Delete persisted tombstones for which ``should_purge(seqno, cas)`` holds.

        Returns the highest purged seqno (0 when nothing was purged).  The partition's blocks
        are rewritten without them (and without stale entries), their by-key records deleted,
        and the purge seqno moved, in one transaction.
        """
        def purge(txn: lmdb.Transaction) -> int:
            highest, _ = self._compact(txn, p, None, None, should_purge)
            if highest > purge_seqno:
                self.put_purge(txn, p, highest)
            return highest

        return self.write(purge)

    def _compact(self, txn: lmdb.Transaction, p: int, resume: bytes | None, budget: int | None,
                 should_purge: Callable[[int, int], bool] | None = None) -> tuple[int, bytes | None]:
        """One compaction step over partition ``p``'s blocks from ``resume`` (None: the first):
        drop stale entries (and, with ``should_purge``, the tombstones it selects), merge small
        blocks, delete the stale marks visited.  Stops after about ``budget`` bytes of source
        values (None: at the end).  Returns (highest purged seqno, where to resume or None).

        WHY here and not per rewrite: cutting one superseded item out of its block at once would
        copy a whole block per rewritten key; marking it stale costs one small-tree entry, and a
        compaction pass, run once stale entries outnumber live ones (or small blocks are many),
        copies about two items per stale one.  A pass runs in bounded steps, one per flush, so
        neither a flush's latency nor its transaction's memory grows with the partition.  A
        block whose items are all stale is dropped undecoded, and a large block with nothing to
        drop stays where it is.  The new blocks' keys fall within the range their source blocks
        covered, so they never collide with blocks not yet visited."""
        bdb, xdb, kdb = self.block_dbs[p], self.stale_dbs[p], self.key_dbs[p]
        marks, small, _ = self._pending.get(p) or self._counts[p] or self._read_counts(txn, p)
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
            n, klen, vlen = _BLOCK_HEADER.unpack_from(blob)
            dead = walker.between(*block_span(k, blob)[1:])
            if dead:
                visited.append(dead)
                marks -= len(dead)
            o = _BLOCK_HEADER.size + 32 * n
            purge_here = should_purge is not None and b"\x01" in blob[o : o + n]
            was_small = _is_small(n, vlen)
            if len(dead) == n:
                source.append(k)  # every item superseded: drop it undecoded
                small -= was_small
            elif not dead and not purge_here and not was_small:
                if source or len(acc):  # leave this block: first write out what precedes it
                    small += self._replace_blocks(txn, bdb, source, acc)
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
            if ok and (chunk >= 4 * BLOCK_VALUE_BYTES or (budget is not None and spent >= budget)):
                resume = cur.key()
                small += self._replace_blocks(txn, bdb, source, acc)
                source, acc, chunk = [], ColsBuffer(), 0
                if budget is not None and spent >= budget:
                    _delete_marks(txn, xdb, visited)
                    self._pending[p] = (marks, max(small, 0), resume)
                    return highest, resume
                ok = cur.set_range(resume)
        small += self._replace_blocks(txn, bdb, source, acc)
        if from_start:
            txn.drop(xdb, delete=False)  # a whole pass visited every mark
            marks = 0
        else:
            _delete_marks(txn, xdb, visited)
        self._pending[p] = (marks, max(small, 0), None)
        return highest, None

    @staticmethod
    def _replace_blocks(txn: lmdb.Transaction, bdb: object, source: list[bytes], acc: ColsBuffer) -> int:
        """Delete the ``source`` blocks and write ``acc`` as new blocks; returns how many of
        those are small."""
        for k in source:
            txn.delete(k, db=bdb)
        if not len(acc):
            return 0
        small = 0
        for record_key, blob in _blocks(*acc.columns()):
            txn.put(record_key, blob, db=bdb)
            n, _klen, vlen = _BLOCK_HEADER.unpack_from(blob)
            small += _is_small(n, vlen)
        return small


def _delete_marks(txn: lmdb.Transaction, xdb: object, visited: list[array]) -> None:
    """Delete the stale marks a compaction step visited (C-level map, no bytecode per mark)."""
    delete = partial(txn.delete, db=xdb)
    for marks in visited:
        deque(map(delete, map(SEQNO.pack, marks)), maxlen=0)


class LongRead:
    """A read transaction that lives as long as a snapshot's disk part is being streamed."""

    __slots__ = ("_store", "txn", "_open")

    def __init__(self, store: Store, txn: lmdb.Transaction) -> None:
        self._store = store
        self.txn = txn
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self.txn.abort()
            except lmdb.Error:
                pass  # the environment was closed under us: the transaction is already gone
            finally:
                self._store._gate.leave()

    def __del__(self) -> None:  # a dropped snapshot must not pin pages forever
        try:
            self.close()
        except Exception:
            pass


def _lock_data_dir(data_dir: Path) -> int:
    """Hold an exclusive ``flock`` on ``<data_dir>/upr.lock`` for as long as the store is open.

    Why: seqnos are allocated in memory, so two engines on one data dir (two processes, or
    the same process twice, which LMDB forbids too) would hand out the same seqnos.  The
    kernel drops the lock when the process dies, so a SIGKILLed server never leaves it stale.
    """
    fd = os.open(data_dir / "upr.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(f"data dir {data_dir} is already open by another engine", field="data_dir") from None
    return fd
