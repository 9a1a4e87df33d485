"""Consistent point-in-time views of a partition for streaming (DCP's disk + memory snapshots).

A ``PartitionSnapshot`` covers ``(after_seqno, high]`` in up to two parts:

* **disk** ``(after, P]``: one LMDB read transaction over the by-seqno tree, where ``P`` is
  the persisted seqno *as recorded inside that same transaction* (the flusher writes it in
  the data's transaction), so the range and the data can never disagree;
* **memory** ``(max(after, P), high]``: a write-queue root taken just after the transaction
  was opened.  A root is deduplicated (and still holds its slots) only above its own persisted
  seqno, so if a flush committed and reached the queue between the two reads
  (``root.persisted > P``), ``capture`` simply retries.

Each part holds every key at most once (the disk reader drops block entries marked stale,
so it yields only a key's latest version; the queue drops a key's older queued slot), so each part is a deduplicated DCP snapshot.
The two parts together may hold a key twice (an older version on disk, a newer in memory),
exactly as two consecutive DCP snapshots may.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate, chain, islice
from operator import itemgetter

from engine.protocol.frames import Columns
from engine.protocol.message_types import SnapshotSource
from engine.core.types import Item
from engine.storage.blocks import Cols, ColsBuffer, block_span, compress_cols, decode_block, seek_block
from engine.storage.records import SEQNO
from engine.storage.stale_marks import StaleMarks
from engine.storage.store import LongRead, Store
from engine.writequeue import QueueRoot

_value_of = itemgetter(5)
_item_of = partial(tuple.__new__, Item)


@dataclass(eq=False)
class SnapshotPart:
    """One contiguous, deduplicated range of a partition's history."""

    source: SnapshotSource
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
        """The same batches as ``batches()`` (same cuts), as ``frames.Columns`` (one sequence
        per field) for ``frames.encode_binary_columns`` / ``encode_json_columns``.

        WHY: building an ``Item`` per scanned record (and transposing them again in the
        encoder) cost more than the LMDB walk itself.  The disk part decodes whole blocks
        (``engine.storage.blocks``): seqnos, cas and revs come out as ``array('Q')`` (one memcpy each),
        deleted flags as ``bytes``, keys by one ``bytes.split`` and values by one C-level
        ``map`` of slices; the memory part transposes its items with one ``zip``.  Iterate once
        (either this or ``batches()``); the disk part releases its read transaction when
        exhausted or closed.
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
        for cols in self.columns(max_items, max_bytes):
            yield list(map(_item_of, zip(cols.keys, cols.seqnos, cols.cas, cols.revs, map(bool, cols.deleted),
                                         cols.values)))

    def columns(self, max_items: int, max_bytes: int) -> Iterator[Columns]:
        read = self._read
        try:
            yield from _cut(self._live_blocks(), max_items, max_bytes)
        finally:
            read.close()

    def _live_blocks(self) -> Iterator[Cols]:
        """Each block's columns from ``start`` on, without stale entries (``engine.storage.compaction``).

        The stale marks are read alongside the blocks (both in seqno order, a window of marks
        per C-level walk): a block without marks costs no per-item Python work at all, and a
        block whose items are all marked is skipped without being decoded."""
        txn = self._read.txn
        store, p, start = self._store, self._partition, self._start
        blocks = txn.cursor(store.block_dbs[p])
        if not seek_block(blocks, SEQNO.pack(start)):
            return
        marks = StaleMarks(txn, store.stale_dbs[p], start)
        for key, blob in blocks.iternext():
            n, first, last = block_span(key, blob)
            if last < start:
                continue
            dead = marks.between(first, last)
            if len(dead) == n:
                continue  # every item superseded
            cols = decode_block(blob)
            if first < start:
                seqnos = cols[1]
                i = bisect_left(seqnos, start)
                cols = tuple(col[i:] for col in cols)
            if dead:
                gone = set(dead)
                cols = compress_cols(cols, [s not in gone for s in cols[1]])
                if not cols[1]:
                    continue
            yield cols

    def close(self) -> None:
        self._read.close()


def _cut(blocks: Iterator[Cols], max_items: int, max_bytes: int) -> Iterator[Columns]:
    """Re-cut block columns into batches of at most ``max_items`` items that close once their
    values reach ``max_bytes`` (the same rule as the memory part's ``batches``)."""
    buf: ColsBuffer | None = None
    count = nbytes = 0
    for cols in blocks:
        values = cols[5]
        n = len(values)
        a = 0
        while a < n:
            room = max_items - count
            b = min(n, a + room)
            piece = values[a:b] if (a or b < n) else values
            size = sum(map(len, piece))
            if nbytes + size >= max_bytes:
                sizes = list(accumulate(map(len, piece)))
                c = bisect_left(sizes, max_bytes - nbytes) + 1  # the item reaching max_bytes closes the batch
                b = a + c
                size = sizes[c - 1]
                close = True
            else:
                close = b - a == room
            part = cols if (a == 0 and b == n) else tuple(col[a:b] for col in cols)
            if buf is None and close:
                yield Columns(*part)
            else:
                if buf is None:
                    buf = ColsBuffer()
                buf.extend(part)
                count += b - a
                nbytes += size
                if close:
                    yield Columns(*buf.columns())
                    buf = None
                    count = nbytes = 0
            a = b
    if buf is not None:
        yield Columns(*buf.columns())


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
        parts.append(SnapshotPart(SnapshotSource.DISK, after_seqno + 1, persisted,
                                  _DiskReader(read, store, partition, after_seqno + 1)))
    else:
        read.close()
    mem_start = max(after_seqno, persisted) + 1
    if root.high >= mem_start:
        parts.append(
            SnapshotPart(SnapshotSource.MEMORY, mem_start, root.high, _MemoryReader(root, mem_start, root.high))
        )
    high = parts[-1].end if parts else after_seqno
    return PartitionSnapshot(partition, high, purge_seqno, parts)


def memory_backlog(root: QueueRoot, after_seqno: int) -> int | None:
    """Items a snapshot after ``after_seqno`` covers when it needs no disk part, else None."""
    if root.persisted > after_seqno or after_seqno + 1 < root.base:
        return None
    return max(0, root.high - after_seqno)


def memory_frame(root: QueueRoot, after_seqno: int, max_backlog: int, max_items: int,
                 max_bytes: int) -> Columns | None:
    """The items ``capture_memory_only(...)``'s one part would yield as its only batch of
    ``columns(max_items, max_bytes)`` (same cut), when that is what it would be: no disk part, at
    most ``max_backlog`` seqnos after ``after_seqno``, at least one item, one batch.  None for
    anything else (nothing new, a disk part, a longer backlog, several batches).

    WHY: a tailing consumer's pass reads a few new items of each partition a write touched, and
    the general reading (snapshot, part, reader, batch generators) cost more per partition than
    the items (``bench.bench_tail_pass``)."""
    high = root.high
    if high <= after_seqno or high - after_seqno > max_backlog or memory_backlog(root, after_seqno) is None:
        return None
    items = list(root.items(after_seqno + 1, high))
    n = len(items)
    if not n or n > max_items:
        return None
    if n > 1 and sum(map(len, map(_value_of, items[:-1]))) >= max_bytes:
        return None  # the batch would close before its last item
    return Columns(*zip(*items))


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
        parts.append(SnapshotPart(SnapshotSource.MEMORY, start, root.high, _MemoryReader(root, start, root.high)))
    return PartitionSnapshot(partition, parts[-1].end if parts else after_seqno, purge_seqno, parts)
