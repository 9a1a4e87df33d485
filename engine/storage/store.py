"""``Store``: the engine's LMDB environment, opened, written and read under one discipline.

The databases and record formats are in ``engine.storage.records``, the block format in
``engine.storage.blocks``, compaction in ``engine.storage.compaction``.

Discipline: every transaction in ``with``; all write transactions go through ``write`` (one
at a time, grown on ``MapFullError``); read transactions are short, except a snapshot's disk
part, which holds one for as long as its reader streams.  Growing the map needs every read
transaction of the process closed, so readers pass through a small gate (``read_txn``).
"""
from __future__ import annotations

import os
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import lmdb

from engine.core import failover, failover_policy
from engine.core.errors import DiskFull, InvalidInput
from engine.core.replica_snapshots import SnapshotMark
from engine.core.types import Item, PartitionState
from engine.storage import blocks
from engine.storage.blocks import block_value, encode_block, is_small, seek_block, split_blocks
from engine.storage.compaction import Compaction
from engine.storage.disk_errors import DISK_ERRNOS, errno_of
from engine.storage.datadir_lock import lock_data_dir, unlock_data_dir
from engine.storage.errors import CorruptStore, IncompatibleDataDir
from engine.storage.records import (
    FORMAT,
    META,
    PERSISTED,
    SEQNO,
    SNAPSHOT,
    db_names,
    deleted_of_record,
    max_dbs,
    seqno_of_record,
)

_tuple_new = tuple.__new__

T = TypeVar("T")


@dataclass(slots=True)
class PartitionMeta:
    """What the meta database says about one partition at open."""

    state: PartitionState
    persisted_seqno: int
    live_items: int
    max_cas: int
    purge_seqno: int
    failover_log: failover.FailoverLog
    #: a replica's snapshot range at the persisted seqno and its last whole snapshot's end
    snapshot: SnapshotMark = SnapshotMark(0, 0, 0)


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


class Store:
    """LMDB access for the engine; thread-safe (writes serialised, reads concurrent)."""

    def __init__(self, env: lmdb.Environment, partitions: int, node_id: str, map_size: int) -> None:
        self.env = env
        self.num_partitions = partitions
        self.node_id = node_id
        self.map_size = map_size
        self._write_lock = threading.Lock()
        self._closed = False
        #: puts that the next write transaction, whoever makes it, runs first (``stage``)
        self._staged: list[Callable[[lmdb.Transaction], None]] = []
        self._staged_lock = threading.Lock()
        self._gate = _ReadGate()
        self.meta_db = env.open_db(b"meta")
        self.block_dbs = []
        self.key_dbs = []
        self.stale_dbs = []
        for p in range(partitions):
            b, k, x = db_names(p)
            self.block_dbs.append(env.open_db(b))
            self.key_dbs.append(env.open_db(k))
            self.stale_dbs.append(env.open_db(x))
        self.compaction = Compaction(self.block_dbs, self.key_dbs, self.stale_dbs)
        self.fsyncs = 0
        self._lock_fd: int | None = None

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(cls, data_dir: Path, partitions: int, map_size: int, failover_cap: int) -> OpenResult:
        """Open or create the environment; on open, record that the store is in use.

        Whether a partition's failover log gets a new entry (created, or opened after an
        unclean stop) is ``engine.core.failover_policy``'s decision.
        """
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = lock_data_dir(data_dir)
        try:
            return cls._open_locked(data_dir, partitions, map_size, failover_cap, lock_fd)
        except BaseException:
            unlock_data_dir(lock_fd)
            raise

    @classmethod
    def _open_locked(cls, data_dir: Path, partitions: int, map_size: int, failover_cap: int,
                     lock_fd: int) -> OpenResult:
        stored = cls._stored_partitions(data_dir, map_size)
        count = stored if stored is not None else partitions
        if count < 1 or count > 4096:
            raise InvalidInput(f"partition count {count} is outside 1..4096", field="partitions")
        env = lmdb.open(
            str(data_dir), map_size=map_size, max_dbs=max_dbs(count), sync=True, metasync=True,
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
                    store.put_state(txn, p, meta.state)
                opened = failover_policy.Opened(created, was_clean, meta.persisted_seqno,
                                                replica=meta.state is PartitionState.REPLICA)
                log = failover_policy.apply(meta.failover_log, opened, failover_cap)
                if log is not meta.failover_log:
                    meta.failover_log = log
                    store.put_failover(txn, p, log)
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
        with self._write_lock:  # a commit outside the engine's writer lock may still be running
            self._closed = True
            self.env.close()
        if self._lock_fd is not None:
            unlock_data_dir(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ transactions

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn`` in one write transaction (committed and fsynced on return).

        ``fn`` must be safe to re-run: on ``MapFullError`` the transaction is aborted, the map
        doubled and ``fn`` called again.  A commit the disk refuses (full, over quota, a write
        cut short) raises ``DiskFull``: the transaction was aborted, nothing changed.
        """
        with self._write_lock:
            return self._write_locked(fn)

    def stage(self, fn: Callable[[lmdb.Transaction], None]) -> None:
        """Queue ``fn`` (a few puts) to run first inside the next write transaction, whoever
        makes it, without waiting for the write lock.

        WHY: a caller that must change a partition's stored state before anything written under
        the new state reaches the disk, but must not wait for the flusher's transaction and an
        fsync first (``Engine.take_over``), stages the change, acts on it in memory, then
        commits it (``commit_staged``).  Any flush of what it took meanwhile is a later write
        transaction, so it carries the staged puts in the same commit: a crash leaves either
        neither or both.  Staged puts run in the order staged, before the transaction's own."""
        with self._staged_lock:
            self._staged.append(fn)

    def commit_staged(self) -> bool:
        """Commit what ``stage`` queued, unless another write transaction already carried it;
        True if this call committed something."""
        if not self._staged:
            return False
        with self._write_lock:
            if not self._staged:
                return False
            self._write_locked(lambda txn: None)
            return True

    def commit_staged_durably(self) -> None:
        """Return once every put staged before this call is committed: by this call's own
        transaction, or by one that took it from the queue (waited for by taking the write
        lock: ``commit_staged`` does not wait for a transaction still being built)."""
        with self._write_lock:
            if self._staged and not self._closed:  # a close carried them with its clean marker
                self._write_locked(lambda txn: None)

    @property
    def staged(self) -> int:
        """How many staged puts wait for a write transaction."""
        return len(self._staged)

    def _write_locked(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        compaction = self.compaction
        with self._staged_lock:
            staged, self._staged = self._staged, []
        done = False
        try:
            while True:
                compaction.begin()
                try:
                    with self.env.begin(write=True) as txn:
                        for put in staged:
                            put(txn)
                        result = fn(txn)
                except lmdb.MapFullError:
                    self._grow()
                    continue
                except lmdb.Error as exc:
                    compaction.abort()
                    number = errno_of(exc)
                    if number in DISK_ERRNOS:
                        raise DiskFull(f"the disk refused the commit ({os.strerror(number)}): nothing "
                                       "changed; retry once space returns", errno=number) from exc
                    raise
                except BaseException:
                    compaction.abort()
                    raise
                compaction.commit()
                self.fsyncs += 1
                done = True
                return result
        finally:
            if not done and staged:  # aborted: the next transaction carries them, still first
                with self._staged_lock:
                    self._staged = staged + self._staged

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
        persisted, live, max_cas = PERSISTED.unpack(pers) if pers else (0, 0, 0)
        purge_raw = txn.get(b"purge/%d" % p, db=db)
        purge = SEQNO.unpack(purge_raw)[0] if purge_raw else 0
        log_raw = txn.get(b"failover/%d" % p, db=db)
        log = failover.decode(log_raw) if log_raw else ()
        snap_raw = txn.get(b"snapshot/%d" % p, db=db)
        snap = SnapshotMark(*SNAPSHOT.unpack(snap_raw)) if snap_raw else SnapshotMark(persisted, persisted, persisted)
        return PartitionMeta(state, persisted, live, max_cas, purge, log, snap)

    def persisted_seqno(self, txn: lmdb.Transaction, p: int) -> int:
        raw = txn.get(b"persisted/%d" % p, db=self.meta_db)
        return SEQNO.unpack_from(raw)[0] if raw else 0

    def put_state(self, txn: lmdb.Transaction, p: int, state: PartitionState) -> None:
        txn.put(b"state/%d" % p, state.value.encode(), db=self.meta_db)

    def put_failover(self, txn: lmdb.Transaction, p: int, log: failover.FailoverLog) -> None:
        txn.put(b"failover/%d" % p, failover.encode(log), db=self.meta_db)

    def put_purge(self, txn: lmdb.Transaction, p: int, seqno: int) -> None:
        txn.put(b"purge/%d" % p, SEQNO.pack(seqno), db=self.meta_db)

    def put_snapshot(self, txn: lmdb.Transaction, p: int, mark: SnapshotMark) -> None:
        txn.put(b"snapshot/%d" % p, SNAPSHOT.pack(mark.snap_start, mark.snap_end, mark.complete_end), db=self.meta_db)

    def drop_partition(self, txn: lmdb.Transaction, p: int) -> None:
        """Empty partition ``p``: its items, by-key records, stale marks and meta (but its state)."""
        txn.drop(self.block_dbs[p], delete=False)
        txn.drop(self.key_dbs[p], delete=False)
        txn.drop(self.stale_dbs[p], delete=False)
        for name in (b"persisted/%d", b"purge/%d", b"snapshot/%d", b"failover/%d"):
            txn.delete(name % p, db=self.meta_db)
        self.compaction.forget(p)

    def put_persisted(self, txn: lmdb.Transaction, p: int, seqno: int, live: int, max_cas: int) -> None:
        txn.put(b"persisted/%d" % p, PERSISTED.pack(seqno, live, max_cas), db=self.meta_db)

    def put_persisted_many(self, txn: lmdb.Transaction, rows: Sequence[tuple[int, int, int, int]]) -> None:
        """``put_persisted`` for each (partition, seqno, live, max_cas) of ``rows``, in one call
        (a flush round touches most partitions, each one record of the same tree)."""
        if rows:
            pack = PERSISTED.pack
            txn.cursor(self.meta_db).putmulti(
                [(b"persisted/%d" % p, pack(seqno, live, max_cas)) for p, seqno, live, max_cas in rows])

    # ------------------------------------------------------------------ data

    def flush_items(self, txn: lmdb.Transaction, p: int, items: Sequence[Item], *,
                    compact: bool = True) -> tuple[int, int]:
        """Write ``items`` (ascending seqnos, each key once); return (live-count change, value bytes).

        A flush may come in slices (consecutive runs of one partition's items, in order, in one
        transaction): all but the last pass ``compact=False``, so the partition still gets one
        bounded compaction step per flush, not one per slice.

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
        delta = len(items) - sum(deleted_) - len(olds) + sum(map(deleted_of_record, olds))
        nbytes = sum(map(len, values))
        bdb = self.block_dbs[p]
        if len(items) <= blocks.BLOCK_ITEMS and nbytes <= blocks.BLOCK_VALUE_BYTES:  # the usual case: one block
            small_blocks = int(is_small(len(items), nbytes))
            if not txn.put(SEQNO.pack(seqnos[0]), encode_block(keys, seqnos, cas_, revs, deleted_, values),
                           append=True, db=bdb):
                raise RuntimeError(f"by-seqno append rejected a block in partition {p}")
        else:  # one block at a time: a big flush never holds a second copy of all its values
            small_blocks = 0
            for record_key, blob in split_blocks(keys, seqnos, cas_, revs, deleted_, values):
                if not txn.put(record_key, blob, append=True, db=bdb):
                    raise RuntimeError(f"by-seqno append rejected a block in partition {p}")
        self.compaction.after_flush(txn, p, list(map(seqno_of_record, olds)), small_blocks, step=compact)
        return delta, nbytes

    def get_item(self, txn: lmdb.Transaction, p: int, key: bytes) -> Item | None:
        meta = txn.get(key, db=self.key_dbs[p])
        if meta is None:
            return None
        seqno, cas, rev, deleted = META.unpack(meta)
        cur = txn.cursor(self.block_dbs[p])
        value = block_value(cur.value(), seqno) if seek_block(cur, meta[:8]) else None
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
            highest, _ = self.compaction.step(txn, p, None, None, should_purge)
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
