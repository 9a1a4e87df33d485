"""The on-disk half of the engine: one LMDB environment holding every partition.

Layout (named databases; ``N`` partitions fixed when the data dir is created)::

    meta             format, partitions, node_id, clean marker,
                     state/<p>, persisted/<p> (seqno, live items, max cas), purge/<p>, failover/<p>
    s<p>  by-seqno   seqno(8, big-endian) + cas(8) + rev(8) + deleted(1) + key  ->  value
    k<p>  by-key     key  ->  seqno(8) + cas(8) + rev(8) + deleted(1)

The by-seqno *key* carries the metadata and the document key, and its *value* is the
document value itself.  Ordering is still by seqno (it is a unique 8-byte prefix, so
``set_range(seqno)`` seeks), and it saves work on both hot paths: the flusher hands the
caller's value bytes to ``putmulti`` unchanged (no concatenation copy), and a by-seqno scan
reads everything an ``Item`` needs from one cursor walk (no second lookup per item, no
value slice).  The by-key record is exactly the by-seqno key's prefix, so a rewrite finds
and deletes the old by-seqno entry with one ``Cursor.replace`` (Couchstore semantics: a
by-seqno scan yields each live key's latest version once).

Discipline: every transaction in ``with``; all write transactions go through ``write`` (one
at a time, grown on ``MapFullError``); read transactions are short, except a snapshot's disk
part, which holds one for as long as its reader streams.  Growing the map needs every read
transaction of the process closed, so readers pass through a small gate (``read_txn``).
"""
from __future__ import annotations

import fcntl
import os
import struct
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import TypeVar

import lmdb

from engine import failover
from engine.errors import InvalidInput, UprError
from engine.types import FailoverEntry, Item, PartitionState

FORMAT = b"1"
#: seqno, cas, rev, deleted: the by-key value and the by-seqno key prefix.
META = struct.Struct(">QQQ?")
META_SIZE = META.size
SEQNO = struct.Struct(">Q")
_PERSISTED = struct.Struct(">QQQ")
_tuple_new = tuple.__new__

T = TypeVar("T")
_value_of = itemgetter(5)  # Item.value


class DataDirInUse(UprError):
    """Raised by ``Engine.open`` only (never by a request): the data dir is held by another engine.

    Lives here rather than in ``engine.errors`` because it is a start-up failure, not part of
    the request error contract that the HTTP and stream layers map."""

    code = "data_dir_in_use"


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


def _db_names(partition: int) -> tuple[bytes, bytes]:
    return b"s%d" % partition, b"k%d" % partition


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
        self.seq_dbs = []
        self.key_dbs = []
        for p in range(partitions):
            s, k = _db_names(p)
            self.seq_dbs.append(env.open_db(s))
            self.key_dbs.append(env.open_db(k))
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
            str(data_dir), map_size=map_size, max_dbs=2 * count + 1, sync=True, metasync=True,
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
            raise InvalidInput(f"data dir {data_dir} has storage format {stored_format!r}; this engine "
                               f"reads {FORMAT!r}", field="data_dir")
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
                try:
                    with self.env.begin(write=True) as txn:
                        result = fn(txn)
                    self.fsyncs += 1
                    return result
                except lmdb.MapFullError:
                    self._grow()

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
        walk; the old record is the old by-seqno key's prefix, so the stale by-seqno entry is
        deleted without another lookup.  New by-seqno records are appended (seqnos ascend).
        """
        kcur = txn.cursor(self.key_dbs[p])
        replace = kcur.replace
        pack = META.pack
        records = []
        add = records.append
        stale = []
        add_stale = stale.append
        delta = 0
        for key, seqno, cas, rev, deleted, value in items:
            meta = pack(seqno, cas, rev, deleted)
            old = replace(key, meta)
            if old is not None:
                add_stale(old + key)
                if not old[24]:
                    delta -= 1
            if not deleted:
                delta += 1
            add((meta + key, value))
        sdb = self.seq_dbs[p]
        if stale:
            delete = txn.delete
            for k in stale:
                delete(k, b"", sdb)
        if records:
            consumed, added = txn.cursor(sdb).putmulti(records, append=True)
            if added != len(records):
                raise RuntimeError(f"by-seqno append rejected {len(records) - added} records in partition {p}")
        return delta, sum(map(len, map(_value_of, items)))

    def lookup(self, txn: lmdb.Transaction, p: int, key: bytes) -> tuple[int, int, int, bool] | None:
        """(seqno, cas, rev, deleted) of the persisted version of ``key``, or None."""
        raw = txn.get(key, db=self.key_dbs[p])
        return META.unpack(raw) if raw is not None else None

    def get_item(self, txn: lmdb.Transaction, p: int, key: bytes) -> Item | None:
        meta = txn.get(key, db=self.key_dbs[p])
        if meta is None:
            return None
        value = txn.get(meta + key, db=self.seq_dbs[p])
        seqno, cas, rev, deleted = META.unpack(meta)
        return _tuple_new(Item, (key, seqno, cas, rev, deleted, value if value is not None else b""))

    def item_count(self, txn: lmdb.Transaction, p: int) -> int:
        """Entries in the by-seqno tree (live items and tombstones)."""
        return txn.stat(self.seq_dbs[p])["entries"]

    def purge_tombstones(self, p: int, should_purge: Callable[[int, int], bool], purge_seqno: int) -> int:
        """Delete persisted tombstones for which ``should_purge(seqno, cas)`` holds.

        Returns the highest purged seqno (0 when nothing was purged).  Both trees lose the
        tombstone, and the purge seqno moves, in one transaction.
        """
        unpack = META.unpack_from

        def purge(txn: lmdb.Transaction) -> int:
            highest = 0
            kdb = self.key_dbs[p]
            cur = txn.cursor(self.seq_dbs[p])
            ok = cur.first()
            while ok:
                k = cur.key()
                if not k:
                    break
                if k[24]:
                    seqno, cas, _rev, _d = unpack(k)
                    if should_purge(seqno, cas):
                        txn.delete(k[META_SIZE:], db=kdb)
                        ok = cur.delete()
                        highest = max(highest, seqno)
                        continue
                ok = cur.next()
            if highest > purge_seqno:
                self.put_purge(txn, p, highest)
            return highest

        return self.write(purge)


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
