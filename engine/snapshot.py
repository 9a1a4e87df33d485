"""Consistent point-in-time views of a partition for streaming (DCP's disk + memory snapshots).

A ``PartitionSnapshot`` covers ``(after_seqno, high]`` in up to two parts:

* **disk** ``(after, P]``: one LMDB read transaction over the by-seqno tree, where ``P`` is
  the persisted seqno *as recorded inside that same transaction* (the flusher writes it in
  the data's transaction), so the range and the data can never disagree;
* **memory** ``(max(after, P), high]``: a write-queue root taken just after the transaction
  was opened.  A root is deduplicated (and still holds its slots) only above its own persisted
  seqno, so if a flush committed and reached the queue between the two reads
  (``root.persisted > P``), ``capture`` simply retries.

Each part holds every key at most once (the by-seqno tree keeps only a key's latest version;
the queue drops a key's older queued slot), so each part is a deduplicated DCP snapshot.
The two parts together may hold a key twice (an older version on disk, a newer in memory),
exactly as two consecutive DCP snapshots may.
"""
from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate, chain, islice
from operator import itemgetter
from dataclasses import dataclass, field
from typing import Literal

from engine.protocol.frames import Columns
from engine.store import META, META_SIZE, SEQNO, LongRead, Store
from engine.types import Item
from engine.writequeue import QueueRoot

_tuple_new = tuple.__new__
_value_of = itemgetter(5)
_meta_of = itemgetter(slice(0, META_SIZE))
_key_of = itemgetter(slice(META_SIZE, None))
_META_FORMAT = META.format.lstrip("><=!@")
_EMPTY_COLUMNS = Columns((), (), (), (), (), ())


def _metas_struct(n: int, cache: dict[int, struct.Struct] = {}) -> struct.Struct:  # noqa: B006 - a cache
    """One ``Struct`` that unpacks the metadata of ``n`` records joined back to back."""
    st = cache.get(n)
    if st is None:
        if len(cache) > 64:
            cache.clear()
        st = cache[n] = struct.Struct(">" + _META_FORMAT * n)
    return st




@dataclass(eq=False)
class SnapshotPart:
    """One contiguous, deduplicated range of a partition's history."""

    source: Literal["disk", "memory"]
    start: int
    end: int
    _reader: "_DiskReader | _MemoryReader" = field(repr=False)

    def batches(self, max_items: int = 1000, max_bytes: int = 1 << 20) -> Iterator[list[Item]]:
        """Items in seqno order, in lists of at most ``max_items`` items / about ``max_bytes``.

        A list closes once its values reach ``max_bytes``, so one huge value still travels
        alone rather than being refused.  Iterate once; the disk part releases its read
        transaction when exhausted or closed.
        """
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        return self._reader.batches(max_items, max_bytes)

    def columns(self, max_items: int = 1000, max_bytes: int = 1 << 20) -> Iterator[Columns]:
        """The same batches as ``batches()`` (same cuts), as ``frames.Columns`` (one list per
        field) for ``frames.encode_binary_columns`` / ``encode_json_columns``.

        WHY: building an ``Item`` per scanned record (and transposing them again in the
        encoder) cost more than the LMDB walk itself; columns are built with C-level
        ``zip``/``map`` and one ``struct`` unpack per batch.  Iterate once (either this or
        ``batches()``); the disk part releases its read transaction when exhausted or closed.
        """
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        return self._reader.columns(max_items, max_bytes)

    def close(self) -> None:
        self._reader.close()


class _DiskReader:
    __slots__ = ("_read", "_store", "_partition", "_start")

    def __init__(self, read: LongRead, store: Store, partition: int, start: int) -> None:
        self._read = read
        self._store = store
        self._partition = partition
        self._start = start

    def batches(self, max_items: int, max_bytes: int) -> Iterator[list[Item]]:
        read = self._read
        try:
            cursor = read.txn.cursor(self._store.seq_dbs[self._partition])
            if not cursor.set_range(SEQNO.pack(self._start)):
                return
            unpack = META.unpack_from
            new = _tuple_new
            item_type = Item
            ks = META_SIZE
            batch: list[Item] = []
            append = batch.append
            room = max_items
            nbytes = 0
            for k, v in cursor.iternext():
                seqno, cas, rev, deleted = unpack(k)
                append(new(item_type, (k[ks:], seqno, cas, rev, deleted, v)))
                nbytes += len(v)
                room -= 1
                if room == 0 or nbytes >= max_bytes:
                    yield batch
                    batch = []
                    append = batch.append
                    room = max_items
                    nbytes = 0
            if batch:
                yield batch
        finally:
            read.close()

    def columns(self, max_items: int, max_bytes: int) -> Iterator[Columns]:
        # Two cursors over the same range of the same read transaction, one yielding keys and
        # one values: walking twice is cheaper than a (key, value) tuple per record and a
        # transposing zip (measured ~90 ns per item less).  The transaction is read-only, so
        # both walks see exactly the same records in the same order.
        read = self._read
        try:
            db = self._store.seq_dbs[self._partition]
            first = SEQNO.pack(self._start)
            kcur = read.txn.cursor(db)
            vcur = read.txn.cursor(db)
            if not kcur.set_range(first) or not vcur.set_range(first):
                return
            key_walk = kcur.iternext(keys=True, values=False)
            value_walk = vcur.iternext(keys=False, values=True)
            rest_keys: list[bytes] = []
            rest_values: list[bytes] = []
            while True:
                keys = list(islice(key_walk, max_items - len(rest_keys)))
                values = list(islice(value_walk, len(keys)))
                if rest_keys:
                    keys[:0] = rest_keys
                    values[:0] = rest_values
                if not keys:
                    return
                sizes = list(accumulate(map(len, values)))
                if sizes[-1] >= max_bytes:
                    cut = bisect_left(sizes, max_bytes) + 1  # the item reaching max_bytes closes the batch
                    rest_keys, keys = keys[cut:], keys[:cut]
                    rest_values, values = values[cut:], values[:cut]
                else:
                    rest_keys = rest_values = []
                flat = _metas_struct(len(keys)).unpack(b"".join(map(_meta_of, keys)))
                yield Columns(list(map(_key_of, keys)), flat[0::4], flat[1::4], flat[2::4], flat[3::4], values)
        finally:
            read.close()

    def close(self) -> None:
        self._read.close()


class _MemoryReader:
    __slots__ = ("_root", "_start", "_end")

    def __init__(self, root: QueueRoot, start: int, end: int) -> None:
        self._root = root
        self._start = start
        self._end = end

    def batches(self, max_items: int, max_bytes: int) -> Iterator[list[Item]]:
        items = self._root.items(self._start, self._end)
        while True:
            chunk = list(islice(items, max_items))
            if not chunk:
                return
            sizes = list(accumulate(map(len, map(_value_of, chunk))))
            if sizes[-1] >= max_bytes:
                cut = bisect_left(sizes, max_bytes) + 1  # the item reaching max_bytes closes the batch
                if cut < len(chunk):
                    items = chain(chunk[cut:], items)
                    chunk = chunk[:cut]
            yield chunk

    def columns(self, max_items: int, max_bytes: int) -> Iterator[Columns]:
        for chunk in self.batches(max_items, max_bytes):
            yield Columns(*zip(*chunk))

    def close(self) -> None:
        self._root = QueueRoot((), 0, -1, -1)  # type: ignore[arg-type]  # unpin the queue root


@dataclass(eq=False)
class PartitionSnapshot:
    """A consistent view of one partition after ``after_seqno`` (see module docstring)."""

    partition: int
    high_seqno: int
    purge_seqno: int
    parts: list[SnapshotPart]

    def items(self) -> Iterator[Item]:
        """Every item of every part, in order (convenience for tests and tools)."""
        for part in self.parts:
            for batch in part.batches():
                yield from batch

    def close(self) -> None:
        """Release the read transaction and the pinned queue root early."""
        for part in self.parts:
            part.close()

    def __enter__(self) -> "PartitionSnapshot":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def capture(store: Store, partition: int, root_of: Callable[[], QueueRoot], after_seqno: int,
            purge_seqno: int) -> PartitionSnapshot:
    """Take the read transaction and the queue root consistently (retrying past a rebase)."""
    while True:
        read = store.begin_long_read()
        try:
            persisted = store.persisted_seqno(read.txn, partition)
            root = root_of()
        except BaseException:
            read.close()
            raise
        if root.persisted <= persisted:
            break  # the root's deduplicated range (root.persisted, high] covers the memory part
        read.close()  # a flush committed after the txn began and the root already reflects it
    parts: list[SnapshotPart] = []
    if after_seqno < persisted:
        parts.append(SnapshotPart("disk", after_seqno + 1, persisted,
                                  _DiskReader(read, store, partition, after_seqno + 1)))
    else:
        read.close()
    mem_start = max(after_seqno, persisted) + 1
    if root.high >= mem_start:
        parts.append(SnapshotPart("memory", mem_start, root.high, _MemoryReader(root, mem_start, root.high)))
    high = parts[-1].end if parts else after_seqno
    return PartitionSnapshot(partition, high, purge_seqno, parts)


def memory_backlog(root: QueueRoot, after_seqno: int) -> int | None:
    """Items a snapshot after ``after_seqno`` covers when it needs no disk part, else None."""
    if root.persisted > after_seqno or after_seqno + 1 < root.base:
        return None
    return max(0, root.high - after_seqno)


def capture_memory_only(partition: int, root: QueueRoot, after_seqno: int,
                        purge_seqno: int) -> PartitionSnapshot | None:
    """The snapshot ``capture`` would take, from the queue root alone, when it can have no disk
    part; None when it may (the caller then takes a full ``capture`` off the event loop).

    WHY: a consumer that keeps up asks on every wake-up for a few items still in the write queue;
    a root is deduplicated above its own persisted seqno and its slots start no later than
    ``persisted + 1``, so at or above that seqno the memory part alone is exact, and no LMDB read
    transaction (nor a thread hop to take one) is needed."""
    if memory_backlog(root, after_seqno) is None or after_seqno > root.high:
        return None
    parts: list[SnapshotPart] = []
    if root.high > after_seqno:
        start = after_seqno + 1
        parts.append(SnapshotPart("memory", start, root.high, _MemoryReader(root, start, root.high)))
    return PartitionSnapshot(partition, parts[-1].end if parts else after_seqno, purge_seqno, parts)
