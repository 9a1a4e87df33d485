"""``read()`` of one Spark task: bounded stream requests over one WebSocket, as Arrow batches.

Runs on executors and is stateless: everything comes from the ``UprInputPartition``.  It speaks
the stream protocol through the shared sans-I/O message and frame modules (``engine.protocol``),
with the binary codec (columnar item batches decode with a few memcpys) and a flow-control window
acknowledged as frames are converted.

Range semantics are DCP's: a request ``(start, end]`` streams every key's latest version with a
seqno in the range, and the server ends the stream after the snapshot that contains ``end``.  By
default the batch keeps those items past ``end`` (a whole snapshot is a consistent state; the next
batch delivers them again, and sinks are idempotent upserts keyed by document key with a seqno
guard).  With ``maxOffsetsPerTrigger`` the cap is hard: items past the planned end are dropped
here and delivered by the next batch.

A replayed batch may name a range the server no longer has (a failover between planning and
reading).  ``read()`` cannot re-plan, so it never follows the branch silently: it emits a
``reset`` control row for that partition and restreams it from 0 (up to the planned end, or the
partition's high seqno if that is lower).  The next planning step sees the branch again and
applies ``onRollback``: redundant but convergent.
"""
from __future__ import annotations

import os
import socket
import sys
from array import array
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc

from engine.protocol import messages as M
from engine.protocol.frames import HEADER, ITEM_BATCH, PER_ITEM_BYTES, ItemBatch, decode_binary

from .planning import WorkItem
from .rows import ARROW_SCHEMA, RESET, control_batch, ops_array

WINDOW_BYTES = 32 * 1024 * 1024
_BIG_ENDIAN = sys.byteorder == "big"


class StreamReadError(RuntimeError):
    """The server refused or ended a planned stream in a way read() cannot repair."""


def stream_url(server: str) -> str:
    url = urlparse(server)
    scheme = "wss" if url.scheme == "https" else "ws"
    return f"{scheme}://{url.netloc}{url.path.rstrip('/')}/stream"


def _u64(values: Any) -> pa.Array:
    if isinstance(values, array) and values.itemsize == 8:
        return pa.Array.from_buffers(pa.uint64(), len(values), [None, pa.py_buffer(values)])
    return pa.array(values, pa.uint64())


def batch_to_arrow(batch: ItemBatch, snap: tuple[int, int]) -> pa.RecordBatch:
    """An ``ItemBatch`` as rows of the source schema, column by column (no per-item Python)."""
    n = len(batch)
    deleted = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(bytes(batch.deleted))])
    keys = pa.array(batch.keys, pa.binary()).cast(pa.string())
    return pa.RecordBatch.from_arrays([
        pa.nulls(n, pa.int32()).fill_null(batch.partition),
        _u64(batch.seqnos).cast(pa.int64(), safe=False),
        keys,
        ops_array().take(deleted),
        pa.array(batch.values, pa.binary()),
        _u64(batch.cas).cast(pa.int64(), safe=False),   # CAS is an opaque token: wrap into BIGINT
        _u64(batch.revs).cast(pa.int64(), safe=False),
        pa.nulls(n, pa.int64()).fill_null(snap[0]),
        pa.nulls(n, pa.int64()).fill_null(snap[1]),
    ], schema=ARROW_SCHEMA)


def frame_to_arrow(data: bytes, snaps: dict[int, tuple[int, int]]) -> pa.RecordBatch:
    """A binary item frame straight into Arrow, without materialising per-item Python objects.

    The frame's columns already have Arrow's layout (little-endian u64 columns, u32 end offsets
    into key and value blobs), so each column is a zero-copy slice of the frame, and the offsets
    only need a leading 0.  The header is checked as every decoder checks it
    (``frames.ITEM_BATCH.check_header``); full Arrow validation (offsets in bounds and
    non-decreasing, keys valid UTF-8) replaces the per-item checks of ``decode_binary``, and
    anything odd falls back to it, so a corrupt frame still raises the protocol's
    ``corrupt_frame`` error naming the field.
    """
    size = len(data)
    if _BIG_ENDIAN:
        return batch_to_arrow(decode_binary(data), (0, 0))
    _, part, n = ITEM_BATCH.check_header(data)
    off = HEADER.size
    fixed = off + PER_ITEM_BYTES * n
    if size < fixed:
        batch = decode_binary(data)          # raises the precise ProtocolError
        return batch_to_arrow(batch, snaps.get(batch.partition, (0, 0)))
    buf = pa.py_buffer(data)
    seqnos = pa.Array.from_buffers(pa.uint64(), n, [None, buf.slice(off, 8 * n)])
    cas = pa.Array.from_buffers(pa.uint64(), n, [None, buf.slice(off + 8 * n, 8 * n)])
    revs = pa.Array.from_buffers(pa.uint64(), n, [None, buf.slice(off + 16 * n, 8 * n)])
    kends = data[off + 24 * n: off + 28 * n]
    vends = data[off + 28 * n: off + 32 * n]
    deleted = pa.Array.from_buffers(pa.uint8(), n, [None, buf.slice(off + 32 * n, n)])
    klen = int.from_bytes(kends[-4:], "little") if n else 0
    vlen = int.from_bytes(vends[-4:], "little") if n else 0
    if size != fixed + klen + vlen:
        batch = decode_binary(data)
        return batch_to_arrow(batch, snaps.get(batch.partition, (0, 0)))
    try:
        keys = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(b"\0\0\0\0" + kends),
                                                      buf.slice(fixed, klen)])
        values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(b"\0\0\0\0" + vends),
                                                        buf.slice(fixed + klen, vlen)])
        keys.validate(full=True)
        values.validate(full=True)
        if pc.max(deleted).as_py() not in (None, 0, 1):
            raise ValueError("deleted flags")
    except (pa.ArrowInvalid, ValueError):
        batch = decode_binary(data)
        return batch_to_arrow(batch, snaps.get(batch.partition, (0, 0)))
    snap = snaps.get(part, (0, 0))
    return pa.RecordBatch.from_arrays([
        pa.nulls(n, pa.int32()).fill_null(part),
        seqnos.cast(pa.int64(), safe=False),
        keys,
        ops_array().take(deleted),
        values,
        cas.cast(pa.int64(), safe=False),
        revs.cast(pa.int64(), safe=False),
        pa.nulls(n, pa.int64()).fill_null(snap[0]),
        pa.nulls(n, pa.int64()).fill_null(snap[1]),
    ], schema=ARROW_SCHEMA)


def read_task(partition: Any) -> Iterator[pa.RecordBatch]:
    """Serve the task's work items; each partition's pieces are streamed one after the other."""
    items: tuple[WorkItem, ...] = partition.items
    rounds: list[list[WorkItem]] = []
    for item in items:   # round k holds the k-th piece of every partition
        k = sum(1 for r in rounds if any(w.partition == item.partition for w in r))
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(item)
    for control in (w for w in items if w.control):
        yield control_batch(control.partition, control.control, control.start)
    if not any(w.end > w.start for w in items):
        return
    yield from coalesce(_stream(partition, rounds), partition.batch_rows)


def coalesce(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Merge small record batches (one per stream frame) into ~``rows``-row ones: Spark pays a fixed
    cost per Arrow batch it receives from a Python worker."""
    held: list[pa.RecordBatch] = []
    count = 0
    for rb in batches:
        held.append(rb)
        count += rb.num_rows
        if count >= rows:
            yield _concat(held)
            held, count = [], 0
    if count:
        yield _concat(held)


def _concat(held: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(held) == 1:
        return held[0]
    return pa.Table.from_batches(held).combine_chunks().to_batches()[0]


def _stream(partition: Any, rounds: list[list[WorkItem]]) -> Iterator[pa.RecordBatch]:
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {partition.token}"} if partition.token else None
    wanted = sorted({w.partition for r in rounds for w in r})
    with connect(stream_url(partition.server), additional_headers=headers, max_size=None,
                 open_timeout=partition.timeout, close_timeout=2) as ws:
        ws.send(M.encode(M.Hello(name=f"spark-{socket.gethostname()}-{os.getpid()}", partitions=tuple(wanted),
                                 codec=M.Codec.BINARY, window_bytes=WINDOW_BYTES)))
        logs = _recv(ws, partition.timeout)
        if not isinstance(logs, M.FailoverLogs):
            raise StreamReadError(f"expected failover_logs after hello, got {type(logs).__name__}")
        highs = {p: info.high_seqno for p, info in logs.partitions.items()}
        unacked = 0
        exact = getattr(partition, "exact_end", False)
        for round_items in rounds:
            open_: dict[int, WorkItem] = {}
            snaps: dict[int, tuple[int, int]] = {}
            for w in round_items:
                if w.end > w.start:
                    ws.send(M.encode(M.StreamRequest(w.partition, w.uuid, w.start, w.snap_start, w.snap_end,
                                                     end_seqno=w.end)))
                    open_[w.partition] = w
            while open_:
                data = ws.recv(timeout=partition.timeout)
                size = len(data)
                if isinstance(data, bytes):
                    rb = frame_to_arrow(data, snaps)
                    if rb.num_rows:
                        p = rb.column(0)[0].as_py()
                        w = open_.get(p)
                        if w is not None and (exact or w.exact) and rb.column(1)[-1].as_py() > w.end:
                            rb = rb.filter(pc.less_equal(rb.column(1), w.end))
                        yield rb
                    msg = None
                else:
                    msg = M.decode_server_message(data)
                if isinstance(msg, ItemBatch):   # JSON codec (not requested, but valid)
                    if len(msg):
                        rb = batch_to_arrow(msg, snaps.get(msg.partition, (0, 0)))
                        w = open_.get(msg.partition)
                        if w is not None and (exact or w.exact) and msg.seqnos[-1] > w.end:
                            rb = rb.filter(pc.less_equal(rb.column(1), w.end))
                        yield rb
                elif isinstance(msg, M.SnapshotMarker):
                    snaps[msg.partition] = (msg.start, msg.end)
                elif isinstance(msg, M.StreamEndMessage):
                    if msg.reason is not M.StreamEndReason.END_SEQNO_REACHED:
                        raise StreamReadError(f"partition {msg.partition}: stream ended early "
                                              f"({msg.reason}) at {msg.last_seqno}")
                    open_.pop(msg.partition, None)
                elif isinstance(msg, M.StreamResponse):
                    status = msg.status
                    if status is M.StreamStatus.OK:
                        pass
                    elif status is M.StreamStatus.ROLLBACK and msg.partition in open_:
                        w = open_[msg.partition]
                        yield control_batch(w.partition, RESET, 0)
                        end = min(w.end, highs.get(w.partition, w.end))
                        ws.send(M.encode(M.StreamRequest(w.partition, 0, 0, 0, 0, end_seqno=end)))
                    else:
                        raise StreamReadError(f"partition {msg.partition}: stream request refused: {status} "
                                              f"{msg.field or ''} {msg.detail}")
                elif isinstance(msg, M.Error):
                    raise StreamReadError(f"server error {msg.code}: {msg.message} (field {msg.field})")
                unacked += size
                if unacked >= WINDOW_BYTES // 4:
                    ws.send(M.encode(M.Ack(unacked)))
                    unacked = 0


def _recv(ws: Any, timeout: float) -> Any:
    data = ws.recv(timeout=timeout)
    return decode_binary(data) if isinstance(data, bytes) else M.decode_server_message(data)
