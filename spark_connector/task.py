"""``read()`` of one Spark task: bounded stream requests over one WebSocket, as Arrow batches.

Runs on executors and is stateless: everything comes from the ``UprInputPartition``.  It speaks
the stream protocol through the shared client session (``engine.protocol.client.session``: hello,
validation, stream ends, rollback decisions, the ack policy), with the binary codec (columnar item
batches go into Arrow with a few memcpys) and a flow-control window acknowledged as frames are
converted.

Range semantics are DCP's: a request ``(start, end]`` streams every key's latest version with a
seqno in the range, and the server ends the stream after the snapshot that contains ``end``.  The
items of that snapshot past ``end`` are dropped here: a micro-batch is an exact range, and the next
batch (which starts at ``end``) delivers them.  How the cut position is recorded and resumed is
``spark_connector.cuts``.

A replayed batch may name a range the server no longer has (a failover between planning and
reading).  ``read()`` cannot re-plan, so it never follows the branch silently: it emits a
``reset`` control row for that partition and restreams it from 0 (up to the planned end, or the
partition's high seqno if that is lower).  The next planning step sees the branch again and
applies ``onRollback``: redundant but convergent.

On a cluster each partition is read from its active node (one connection per node, the routes
planning saw, or the map read by the task itself).  A partition that moves (``not_my_partition``,
a ``state_changed`` end) or a node lost mid-read makes the task wait (``fetchOffset.retryIntervalMs``,
doubling, at most ``fetchOffset.numRetries`` times per task), read the map again and resume what is
left of every unfinished piece from its last delivered item on the new active
(``cluster_map.resume_item``): nothing is read twice, and a piece planned on a branch the new
active does not hold stops where that branch ends (``cluster_map.reachable_end``) so the next
planning step meets the branch through ``onRollback``.
"""
from __future__ import annotations

import os
import socket
import sys
from array import array
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from clients.connection import stream_url
from engine.protocol import messages as M
from engine.protocol.client.acks import AckTracker
from engine.protocol.client.actions import Deliver, EndAction, Moved, Reconnect, Repair, Send, StreamEnded
from engine.protocol.client.errors import ClientError
from engine.protocol.client.incoming import decode_frame, frame_bytes
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.session import ClientSession
from engine.protocol.frames import HEADER, ITEM_BATCH, PER_ITEM_BYTES, ItemBatch, decode_binary

from .cluster_map import Fault, Progress, fault_of_end, fault_of_refusal, reachable_end, resume_item, split_routes
from .cuts import items_through
from .retry import Retryable, SourceUnavailable
from .planning import WorkItem
from .rows import ARROW_SCHEMA, RESET, control_batch, ops_array

WINDOW_BYTES = 32 * 1024 * 1024
_BIG_ENDIAN = sys.byteorder == "big"


class StreamReadError(RuntimeError):
    """The server refused or ended a planned stream in a way read() cannot repair."""


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
    for control in (w for w in items if w.control):
        yield control_batch(control.partition, control.control, control.start)
    if not any(w.end > w.start for w in items):
        return
    yield from coalesce(_follow(partition, items), partition.batch_rows, partition.batch_bytes)


Keyed = tuple[tuple[int, int], WorkItem]   # (planned partition, planned start) and the item to read now


def _rounds(items: Iterable[Keyed]) -> list[list[Keyed]]:
    """Round k holds the k-th piece of every partition: a partition's pieces are read in order."""
    rounds: list[list[Keyed]] = []
    for key, item in items:
        k = sum(1 for r in rounds if any(w.partition == item.partition for _, w in r))
        if k == len(rounds):
            rounds.append([])
        rounds[k].append((key, item))
    return rounds


class _NodeFault(Exception):
    """The node stopped serving (some of) this task's partitions: read the map, resume elsewhere."""

    def __init__(self, fault: Fault, cause: str) -> None:
        super().__init__(cause)
        self.fault = fault


def _follow(partition: Any, items: tuple[WorkItem, ...]) -> Iterator[pa.RecordBatch]:
    """Stream every work item from its partition's active node, one connection per node; on a
    move or a lost node, read the map again and resume what is left from what was delivered
    (``cluster_map.resume_item``), within ``fetchOffset.numRetries`` waits."""
    servers: tuple[str, ...] = tuple(getattr(partition, "servers", ()) or (partition.server,))
    routes: dict[int, str] | None = dict(partition.routes) if getattr(partition, "routes", ()) else None
    if routes is None and len(servers) > 1:
        routes = _read_routes(partition, servers, None)
    progress: dict[tuple[int, int], Progress] = {}
    delays = partition.retry.delays()
    started = time.monotonic()
    attempts = 0
    while True:
        left: list[Keyed] = []
        for w in items:
            key = (w.partition, w.start)
            now = resume_item(w, progress.get(key))
            if now is not None and now.end > now.start:
                left.append((key, now))
        if not left:
            return
        by_node: dict[str, list[Keyed]] = {}
        for key, w in left:
            by_node.setdefault((routes or {}).get(w.partition, partition.server), []).append((key, w))
        attempts += 1
        faults: list[_NodeFault] = []
        for url, node_items in by_node.items():
            try:
                yield from _stream(partition, url, node_items, progress)
            except _NodeFault as fault:        # the other nodes' partitions go on meanwhile
                faults.append(fault)
        if not faults:
            return
        delay = next(delays, None)
        if delay is None:
            raise SourceUnavailable(
                f"partitions {sorted({w.partition for _, w in left})}: {faults[0]}; gave up after {attempts} "
                f"attempt{'s' if attempts > 1 else ''} in {time.monotonic() - started:.1f} s "
                f"({partition.retry.describe()})") from None
        time.sleep(delay)
        routes = _read_routes(partition, servers, routes)


def _read_routes(partition: Any, servers: tuple[str, ...], old: dict[int, str] | None) -> dict[int, str] | None:
    """The map's routes for this task's partitions now; the old ones when no node answers (the
    next connect fails and counts as one more retry)."""
    from .meta import read_map
    try:
        _, view = read_map(servers, partition.token, partition.timeout)
    except Retryable:
        return old
    if view is None:
        return None
    # a partition without a live active keeps its old route: its connect fails and is retried
    routes, _ = split_routes(view, {w.partition for w in partition.items})
    return {**(old or {}), **routes}


def _stream(partition: Any, url_base: str, items: list[Keyed],
            progress: dict[tuple[int, int], Progress]) -> Iterator[pa.RecordBatch]:
    """Each round is one ``ClientSession`` over one connection to ``url_base``: the session
    validates every message, decides rollbacks (always a reset: see the module docstring) and the
    acks; this function only moves frames and turns items into Arrow.  ``progress`` is keyed by
    the planned item (partition, planned start) and records what was delivered."""
    from websockets.exceptions import InvalidHandshake, InvalidStatus, WebSocketException
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {partition.token}"} if partition.token else None
    wanted = sorted({w.partition for _, w in items})
    name = f"spark-{socket.gethostname()}-{os.getpid()}"
    url = stream_url(url_base)
    try:
        ws = connect(url, additional_headers=headers, max_size=None, open_timeout=partition.timeout,
                     close_timeout=2)
    except InvalidStatus as exc:
        if exc.response.status_code >= 500:
            raise _NodeFault(Fault.LOST, f"stream connection to {url}: HTTP {exc.response.status_code}") from None
        raise
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise _NodeFault(Fault.LOST, f"stream connection to {url}: cannot connect: "
                                     f"{exc or type(exc).__name__}") from None
    try:
        with ws:
            hello = ClientSession(partitions=wanted, window_bytes=WINDOW_BYTES)
            ws.send(M.encode(hello.hello(name, M.Codec.BINARY)))
            data = ws.recv(timeout=partition.timeout)
            hello.receive_handshake(decode_frame(data), frame_bytes(data))
            logs = _failover_logs(decode_frame(data))
            acks = hello.acks   # one flow-control window for the whole connection
            for round_items in _rounds(items):
                yield from _round(ws, partition.timeout, logs, acks, round_items, url, progress)
    except (OSError, TimeoutError, WebSocketException) as exc:
        raise _NodeFault(Fault.LOST, f"connection to {url} lost: {exc or type(exc).__name__}") from None
    except ClientError as exc:
        raise StreamReadError(str(exc)) from None


def coalesce(batches: Iterator[pa.RecordBatch], rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """Merge small record batches (one per stream frame) into ~``rows``-row ones: Spark pays a fixed
    cost per Arrow batch it receives from a Python worker.  No batch yielded holds more than
    ``max_bytes`` (Arrow buffer bytes) unless it is a single row: frames are cut to fit, and a
    batch ends before the frame that would push it past the cap."""
    held: list[pa.RecordBatch] = []
    count = size = 0
    for rb in batches:
        for piece in _within(rb, max_bytes):
            n = piece.nbytes
            if held and size + n > max_bytes:
                yield _concat(held)
                held, count, size = [], 0, 0
            held.append(piece)
            count += piece.num_rows
            size += n
            if count >= rows:
                yield _concat(held)
                held, count, size = [], 0, 0
    if held:
        yield _concat(held)


def _within(rb: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``rb`` as zero-copy slices of at most ``max_bytes`` each (or one row), halving as needed."""
    if rb.num_rows <= 1 or rb.nbytes <= max_bytes:
        yield rb
        return
    half = rb.num_rows // 2
    yield from _within(rb.slice(0, half), max_bytes)
    yield from _within(rb.slice(half), max_bytes)


def _concat(held: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(held) == 1:
        return held[0]
    return pa.Table.from_batches(held).combine_chunks().to_batches()[0]


def _resume(w: WorkItem, logs: M.FailoverLogs) -> StreamOffset:
    info = logs.partitions.get(w.partition)
    if info is None:
        return w.position
    return w.resume_position(info.log[0].uuid if info.log else 0, info.high_seqno)


def _through(rb: pa.RecordBatch, end: int) -> pa.RecordBatch:
    """The items of ``rb`` at or below the planned end (seqno order: a prefix)."""
    if not rb.num_rows or rb.column(1)[-1].as_py() <= end:
        return rb
    return rb.slice(0, items_through(rb.column(1).to_pylist(), end))


def _failover_logs(msg: Any) -> M.FailoverLogs:
    assert isinstance(msg, M.FailoverLogs)  # receive_handshake refused anything else
    return msg


def _round(ws: Any, timeout: float, logs: M.FailoverLogs, acks: AckTracker,
           keyed: list[tuple[tuple[int, int], WorkItem]], url: str,
           progress: dict[tuple[int, int], Progress]) -> Iterator[pa.RecordBatch]:
    """Stream one piece of each partition of the round, each from its planned (or resumed)
    position, recording in ``progress`` what was delivered; a move or a going-away node raises
    ``_NodeFault`` so the caller resumes elsewhere."""
    planned: dict[int, WorkItem] = {}
    keys: dict[int, tuple[int, int]] = {}
    ends: dict[int, int] = {}
    for key, w in keyed:
        info = logs.partitions.get(w.partition)
        end = w.end
        if info is not None:
            end = reachable_end([(e.uuid, e.seqno) for e in info.log], info.high_seqno, w.branch_uuid, w.end)
            if end < w.start:
                end = w.end          # the start itself is off the branch: the server answers a rollback
        if end <= w.start:
            progress[key] = replace(progress.get(key) or Progress(w.start, None, w.uuid), done=True)
            continue
        planned[w.partition], keys[w.partition], ends[w.partition] = w, key, end
    if not planned:
        return
    session = ClientSession(partitions=sorted(planned), start="beginning", on_rollback="reset",
                            offsets={p: _resume(w, logs) for p, w in planned.items()},
                            end_seqnos=ends, window_bytes=WINDOW_BYTES, follow_map=True)
    session.acks = acks
    highs = {p: info.high_seqno for p, info in logs.partitions.items()}
    for request in session.handshake(logs.node_id, logs.partition_count, logs.partitions):
        ws.send(M.encode(request))
    snaps: dict[int, tuple[int, int]] = {}

    def delivered(p: int, rb: pa.RecordBatch) -> pa.RecordBatch:
        rb = _through(rb, ends[p])
        if rb.num_rows:
            key = keys[p]
            old = progress.get(key)
            progress[key] = Progress(rb.column(1)[-1].as_py(), snaps.get(p), session.positions[p].uuid,
                                     reset=bool(old and old.reset))
        return rb

    while not session.all_finished:
        data = ws.recv(timeout=timeout)
        size = frame_bytes(data)
        if isinstance(data, bytes):
            rb = frame_to_arrow(data, snaps)
            if rb.num_rows:
                p = rb.column(0)[0].as_py()
                session.items_arrived(p)
                yield delivered(p, rb)
            actions: list[Any] = []
        else:
            actions = session.receive(decode_frame(data))
        for action in actions:
            kind = type(action)
            if kind is Deliver and type(action.message) is ItemBatch:   # JSON codec (not requested, but valid)
                batch = action.message
                if len(batch):
                    yield delivered(batch.partition, batch_to_arrow(batch, snaps.get(batch.partition, (0, 0))))
            elif kind is Deliver and type(action.message) is M.SnapshotMarker:
                snaps[action.message.partition] = (action.message.start, action.message.end)
            elif kind is StreamEnded:
                if action.then is EndAction.FINISHED and action.reason == M.StreamEndReason.END_SEQNO_REACHED.value:
                    key = keys[action.partition]
                    progress[key] = replace(progress.get(key) or Progress(0, None, 0), done=True)
                    continue
                cause = (f"partition {action.partition}: stream ended early on {url} ({action.reason}) "
                         f"at {action.last_seqno}")
                if fault_of_end(str(action.reason)) is not Fault.FATAL:
                    raise _NodeFault(fault_of_end(str(action.reason)), cause)
                raise StreamReadError(cause)
            elif kind is Moved:
                cause = (f"partition {action.partition}: {action.reason} on {url}"
                         + (f" ({action.detail})" if action.detail else ""))
                fault = fault_of_refusal(action.reason) if action.reason != "state_changed" else Fault.MOVED
                if fault is Fault.FATAL:
                    raise StreamReadError(cause)
                raise _NodeFault(fault, cause)
            elif kind is Repair:
                # the planned position is on a branch the server no longer has: restream the
                # partition from 0, up to the planned end or the partition's high seqno if lower
                # (the items between would never come on the branch that exists)
                w = planned[action.plan.partition]
                yield control_batch(w.partition, RESET, 0)
                progress[keys[w.partition]] = Progress(0, None, 0, reset=True)
                request = session.finish_rollback(action.plan)
                end = min(ends[w.partition], highs.get(w.partition, w.end))
                ends[w.partition] = end
                ws.send(M.encode(replace(request, end_seqno=end)))
            elif kind is Send:
                ws.send(M.encode(action.message))
            elif kind is Reconnect:
                raise StreamReadError(f"stream request refused on {url}: {action.reason}")
        ack = session.processed(size)
        if ack is not None:
            ws.send(M.encode(ack))
