"""The asyncio consumer: a thin I/O adapter around ``ClientSession`` (WebSocket, HTTP, clock, files).

Typical use::

    async with Consumer("http://127.0.0.1:8000", token=tok, name="indexer",
                        state=FileStateStore("./indexer-state")) as consumer:
        async for event in consumer:
            if isinstance(event, Mutation): index.put(event.key, event.value)
            elif isinstance(event, Deletion): index.delete(event.key)
            elif isinstance(event, PartitionReset): index.drop_partition(event.partition)

Processed, not received
-----------------------
An event counts as processed when the consumer is asked for the next one (or the handler given to
``run`` returned, or ``commit()`` is called while handling it).  Only then do positions move, bytes
get acknowledged to the server and state become eligible for saving, so a crash at any point resumes
at or before the first unprocessed item, never after it (dcp.md §3.4), and a slow handler slows the
server instead of filling memory (flow control, §3.6).  Breaking out of the loop leaves the last
yielded event unprocessed unless ``commit()`` was called for it: it will come again (at-least-once).

The ring buffer (``clients.ring``) is written before a batch is handed over, so a rollback can be
repaired key by key later; see ``_rollback`` for the repair itself.

Batch fast path: ``async for x in consumer.batches()`` yields whole ``ItemBatch`` objects (columns:
``seqnos``, ``keys``, ``values``...; ``deleted[i]`` 0/1) instead of one event per item, and every other
event as usual; a batch counts as processed when the next one is requested.
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from engine.protocol import messages as M
from engine.protocol.bundle import BUNDLE_MAGIC, decode_bundle
from engine.protocol.errors import ProtocolError
from engine.protocol.frames import ItemBatch, decode_binary
from engine.core.types import Document

from .backoff import Backoff
from .errors import AuthFailed, ConnectionFailed, ProtocolViolation, ServerError, StreamRejected, UsageError
from .events import (
    BarrierReached,
    Deletion,
    Event,
    Mutation,
    PartitionReset,
    Rollback,
    SnapshotEnd,
    SnapshotStart,
    StreamEnd,
    events_of,
)
from .flow import AckTracker
from .http import AsyncHttpApi, default_server, default_token
from .offset import StreamOffset
from .ring import RollbackRing
from .session import ClientSession, EndAction, RollbackPlan, RollbackPolicy, SeekAction, StartMode
from .state import FileStateStore, MemoryStateStore, StateStore

__all__ = ["Consumer", "Handler"]

log = logging.getLogger("upr.client")

Handler = Callable[[Any], "Awaitable[None] | None"]

DEFAULT_WINDOW = 8 << 20
#: A partition refused as "not my partition" this many times in a row is given up (StreamRejected).
MAX_NOT_MY_PARTITION = 5
_PROTOCOL_CLOSE_CODES = {1003, 1008, 1009}
#: ``error`` codes answering hello that mean "the arguments were wrong", not "the server failed".
_CALLER_MISTAKES = {"invalid_partition", "invalid_field"}


def stream_url(server: str) -> str:
    base = server.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://"):] + "/stream"
    if base.startswith("http://"):
        return "ws://" + base[len("http://"):] + "/stream"
    if base.startswith(("ws://", "wss://")):
        return base if base.endswith("/stream") else base + "/stream"
    raise UsageError(f"server URL must start with http:// or https://, got {server!r}", field="server")


def _frame_bytes(frame: str | bytes) -> int:
    if isinstance(frame, str):
        return len(frame) if frame.isascii() else len(frame.encode())
    return len(frame)


class _Reconnect(Exception):
    """Internal: drop this connection and handshake again (after a backoff)."""


class Consumer:
    """One WebSocket stream over a set of partitions; see the module docstring."""

    def __init__(
        self,
        server: str | None = None,
        *,
        token: str | None = None,
        name: str = "upr-client",
        partitions: Sequence[int] | None = None,
        start: str | StartMode = StartMode.SAVED,
        state: StateStore | str | os.PathLike[str] | None = None,
        ring_size: int = 100_000,
        ring: RollbackRing | None = None,
        until_now: bool = False,
        offsets: Mapping[int, StreamOffset] | None = None,
        end_seqnos: Mapping[int, int] | None = None,
        codec: str = "binary",
        window_bytes: int = DEFAULT_WINDOW,
        ack_ratio: float = 0.2,
        commit_interval: float = 1.0,
        max_reconnect_attempts: int | None = None,
        backoff: Backoff | None = None,
        open_timeout: float = 10.0,
        ping_interval: float | None = 20.0,
        max_frame_bytes: int = 256 << 20,
        correction_concurrency: int = 16,
        max_corrections: int = 10_000,
        commit: str = "item",
        handler: Handler | None = None,
        on_rollback: str | RollbackPolicy = RollbackPolicy.REPAIR,
        bundle: bool = True,
    ) -> None:
        self.server = (server or default_server()).rstrip("/")
        self.url = stream_url(self.server)
        self.token = token if token is not None else default_token()
        self.name = name
        self.codec = M.Codec(codec)
        self.window_bytes = window_bytes
        #: accept bundle frames (several server messages in one WebSocket message): fewer
        #: messages for the server to send, the same messages for this loop to process
        self.bundle = bundle
        if commit not in ("item", "snapshot"):
            raise UsageError(f"commit must be 'item' or 'snapshot', got {commit!r}", field="commit")
        if isinstance(state, (str, os.PathLike)):
            state = FileStateStore(state)
        self.state_store: StateStore = state if state is not None else MemoryStateStore()
        acquire = getattr(self.state_store, "acquire", None)
        if acquire is not None:
            acquire()  # before the ring file in the same directory is touched
        try:
            saved = self.state_store.load() if StartMode(start) is StartMode.SAVED else None
            if ring is None and ring_size > 0:
                ring = RollbackRing(ring_size, self.state_store.ring_directory)
            self.session = ClientSession(partitions=partitions, start=start, saved=saved, offsets=offsets,
                                         end_seqnos=end_seqnos, until_now=until_now, ring=ring,
                                         max_corrections=max_corrections, on_rollback=on_rollback)
        except BaseException:
            if ring is not None:
                ring.close()
            release = getattr(self.state_store, "close", None)
            if release is not None:
                release()
            raise
        self.ring = ring
        self.acks = AckTracker(window_bytes, ack_ratio)
        #: "item": save the last processed item (a partial snapshot is saved as such); "snapshot":
        #: save only whole processed snapshots, for handlers that apply a snapshot at its end.
        self.commit_mode = commit
        self.commit_interval = commit_interval
        self.max_reconnect_attempts = max_reconnect_attempts
        self.backoff = backoff or Backoff()
        self.open_timeout = open_timeout
        self.ping_interval = ping_interval
        self.max_frame_bytes = max_frame_bytes
        self.correction_concurrency = correction_concurrency
        self.handler = handler
        self.http = AsyncHttpApi(self.server, self.token)
        self._ws: ClientConnection | None = None
        self._gen: AsyncIterator[Any] | None = None
        self._gen_kind: str | None = None
        self._iterating = False
        self._closed = False
        self._done = False
        self._last_save = time.monotonic()
        self._dirty = False
        self._idle_save: asyncio.TimerHandle | None = None
        self._cookies = itertools.count(1)
        self._barriers: dict[str, asyncio.Future[BarrierReached]] = {}
        self._not_mine: dict[int, int] = {}
        # seeks waiting for the stream loop: partitions to request, or a reconnect for open streams
        self._seek_requests: set[int] = set()
        self._seek_reconnect = False
        self._reading = False  # the stream loop awaits the next frame (a seek from elsewhere must wake it)
        self._wake: asyncio.Task[None] | None = None
        # the batch being handed over item by item: commit() applies it up to the current item
        self._b_pos: Any = None
        self._b_seqnos: Sequence[int] = ()
        self._b_done = 0
        self._b_i = -1
        self._b_events: Any = None  # its per-item iterator, drained by a seek of its partition
        self._b_cut = False
        # the rest of a bundle being processed: (message, bytes it accounts for) of this connection
        self._parts: deque[tuple[str | bytes, int]] = deque()
        # counters
        self.reconnects = 0
        self.items_processed = 0
        self.corrections = 0

    # ------------------------------------------------------------------ public API
    async def __aenter__(self) -> "Consumer":
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the stream now (otherwise the first iteration does): errors surface here."""
        if self._ws is None and not self._done:
            await self._open()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterator("events")

    def batches(self) -> AsyncIterator[ItemBatch | Event]:
        """Whole item batches instead of per-item events (throughput-critical consumers)."""
        return self._iterator("batches")

    async def run(self, handler: Handler | None = None) -> None:
        """Hand every event to ``handler`` (sync or async) until the streams end or ``close()``.

        Items are handed over straight from each decoded batch, without a generator switch per
        item (the cheapest way to consume per item); an event counts as processed once the
        handler returned (or its awaitable finished)."""
        handler = handler or self.handler
        if handler is None:
            raise UsageError("run() needs a handler")
        isawaitable = inspect.isawaitable
        async for x in self._iterator("batches"):
            if type(x) is not ItemBatch:
                result = handler(x)
                if isawaitable(result):
                    await result
                continue
            i = 0
            self._b_events = events = events_of(x)
            for event in events:
                self._b_i = i
                result = handler(event)
                if result is not None and isawaitable(result):
                    await result
                i += 1

    def request_barrier(self) -> str:
        """Send a barrier cookie now and return it; a ``BarrierReached`` with it comes later."""
        cookie = f"c{next(self._cookies)}"
        self._barriers[cookie] = asyncio.get_running_loop().create_future()
        if self._ws is not None:
            asyncio.ensure_future(self._send_quiet(M.Barrier(cookie)))
        return cookie

    async def barrier(self, timeout: float | None = None) -> BarrierReached:
        """Return once the consumer has *processed* a consistent point of every partition.

        Every mutation acknowledged to a writer before this call is processed before it returns.
        Call it from another task than the one iterating, or with no one iterating and a
        ``handler`` given to the constructor (then this call drives the stream itself)."""
        if self._done or self._closed:
            raise UsageError("barrier() after the streams ended or the consumer was closed")
        if self._ws is None:
            await self.connect()
        cookie = self.request_barrier()
        fut = self._barriers[cookie]
        if self._iterating:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        if self.handler is None:
            raise UsageError("barrier() with nobody consuming: iterate the consumer in another task, "
                             "or pass handler= so that barrier() can drive the stream")

        async def pump() -> BarrierReached:
            async for event in self:
                result = self.handler(event)  # type: ignore[misc]
                if inspect.isawaitable(result):
                    await result
                if type(event) is BarrierReached and event.cookie == cookie:
                    self._barriers.pop(cookie, None)
                    return event  # the handler returned: processed
            raise ConnectionFailed("the stream ended before the barrier came back")

        return await asyncio.wait_for(pump(), timeout)

    async def commit(self) -> None:
        """Save the processed position of every partition now (including the event being handled)."""
        self._apply_batch_progress(self._b_i + 1)
        self._save()

    def committed(self) -> dict[int, StreamOffset]:
        """Current processed position per partition (what a restart would resume from after commit)."""
        return self.session.committed()

    def position(self, partition: int) -> StreamOffset:
        return self.session.positions[partition].offset()

    def seek(self, partition: int, offset: StreamOffset) -> None:
        """Restart ``partition`` from ``offset`` (java-dcp-client's ``rollbackAndRestartStream``).

        Typical use is with ``on_rollback="report"``: on a ``Rollback`` event the handler cuts its
        own copy back to a position it holds exactly and seeks there; called while the event is
        being handled, the partition's next stream starts at ``offset`` instead of at the rollback
        point.  Called at other times: before the stream opened it replaces the start offset; for
        a partition whose bounded stream ended, the partition is streamed again; for a partition
        that is streaming, the consumer reconnects (other partitions resume from their processed
        positions) so that no item of the old stream is handed over after this call returns
        (the event being handled when it is called counts as processed); called from another task
        while the stream waits for frames, it closes the socket to reconnect at once.
        Nothing above ``offset`` counts as applied any more (the ring forgets it)."""
        if self._closed or self._done:
            raise UsageError("seek() after the streams ended or the consumer was closed", partition=partition)
        action = self.session.seek(partition, offset)
        if action is SeekAction.REQUEST:
            self._seek_requests.add(partition)
        elif action is SeekAction.RECONNECT:
            self._seek_reconnect = True
            if self._b_pos is not None and self._b_pos is self.session.positions.get(partition):
                # the rest of the batch being handed over belongs to the old stream: drop it (a
                # C-level drain of its iterator ends the item loop; nothing is counted processed)
                self._b_cut = True
                if self._b_events is not None:
                    deque(self._b_events, maxlen=0)
            elif self._reading and self._ws is not None:
                # called from another task while the stream waits for a frame that may never come
                # (idle partitions): closing the socket wakes it, and it reconnects at once
                self._wake = asyncio.get_running_loop().create_task(self._ws.close())

    @property
    def rollbacks(self) -> int:
        return self.session.rollbacks

    @property
    def resets(self) -> int:
        return self.session.resets

    async def close(self) -> None:
        """Save processed state, close the stream, the ring and the HTTP client."""
        if self._closed:
            return
        self._closed = True
        if self._idle_save is not None:
            self._idle_save.cancel()
            self._idle_save = None
        gen, self._gen = self._gen, None
        if gen is not None:
            try:
                await gen.aclose()  # type: ignore[attr-defined]
            except Exception:  # pragma: no cover - closing a broken generator
                pass
        try:
            if self.session.positions:
                self._save()
        finally:
            if self._ws is not None:
                await self._ws.close()
                self._ws = None
            if self.ring is not None:
                self.ring.close()
            close_store = getattr(self.state_store, "close", None)
            if close_store is not None:
                close_store()
            await self.http.aclose()
            for fut in self._barriers.values():
                if not fut.done():
                    fut.set_exception(ConnectionFailed("consumer closed before the barrier came back"))
                    fut.exception()  # awaiters still get it; nobody waiting is not an error

    # ------------------------------------------------------------------ connection
    async def _open(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            ws = await connect(self.url, additional_headers=headers, open_timeout=self.open_timeout,
                               max_size=self.max_frame_bytes, ping_interval=self.ping_interval,
                               ping_timeout=self.ping_interval, compression=None)
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise AuthFailed(f"{self.url}: HTTP {status}: the token is missing, unknown or lacks the read role",
                                 field="token") from None
            raise ConnectionFailed(f"{self.url}: WebSocket upgrade refused with HTTP {status}") from None
        except (OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
            raise ConnectionFailed(f"cannot reach {self.url}: {exc or type(exc).__name__}") from None
        try:
            partitions = self.session.requested_partitions
            await ws.send(M.encode(M.Hello(self.name, tuple(sorted(partitions)) if partitions is not None else None,
                                           self.codec, self.window_bytes, bundle=self.bundle)))
            first = await asyncio.wait_for(ws.recv(), self.open_timeout)
            msg = self._decode_text(first) if isinstance(first, str) else None
            if isinstance(msg, M.Error):
                if msg.code in _CALLER_MISTAKES:  # e.g. a partition the server does not have
                    raise UsageError(f"server refused hello: {msg.code}: {msg.message}", field=msg.field,
                                     partition=msg.partition)
                raise ServerError(f"server refused hello: {msg.code}: {msg.message}", server_code=msg.code,
                                  field=msg.field)
            if not isinstance(msg, M.FailoverLogs):
                raise ProtocolViolation(f"expected failover_logs after hello, got {type(msg).__name__}")
            self.acks.reset()
            self.acks.processed(_frame_bytes(first))
            requests = self.session.handshake(msg.node_id, msg.partition_count, msg.partitions)
            for req in requests:
                await ws.send(M.encode(req))
            for cookie, fut in self._barriers.items():
                if not fut.done():
                    await ws.send(M.encode(M.Barrier(cookie)))
        except ConnectionClosed as exc:
            await ws.close()
            raise ConnectionFailed(f"{self.url}: connection closed during the handshake: {exc}") from None
        except BaseException:
            await ws.close()
            raise
        self._ws = ws
        if not requests:
            self._done = self.session.all_finished

    async def _reconnect(self, why: str) -> None:
        """Drop the connection and handshake again, with capped exponential backoff and jitter."""
        self.session.connection_lost()
        self.acks.reset()
        self._parts.clear()  # the rest of a bundle of the old connection is not processed
        if self._ws is not None:
            ws, self._ws = self._ws, None
            await ws.close()
        attempt = 0
        while not self._closed:
            attempt += 1
            delay = self.backoff.next_delay()
            log.info("consumer %s reconnecting in %.3fs (attempt %d): %s", self.name, delay, attempt, why)
            await asyncio.sleep(delay)
            try:
                await self._open()
            except ConnectionFailed as exc:
                why = str(exc)
                if self.max_reconnect_attempts is not None and attempt >= self.max_reconnect_attempts:
                    raise
                continue
            self.reconnects += 1
            return

    async def _send(self, msg: Any) -> None:
        assert self._ws is not None
        await self._ws.send(M.encode(msg))

    async def _send_quiet(self, msg: Any) -> None:
        """Send, ignoring a closed connection: the next receive notices it and reconnects."""
        ws = self._ws
        if ws is None:
            return
        try:
            await ws.send(M.encode(msg))
        except ConnectionClosed:
            pass

    async def _processed(self, nbytes: int) -> None:
        n = self.acks.processed(nbytes)
        if n:
            await self._send_quiet(M.Ack(n))

    def _decode_text(self, frame: str) -> Any:
        try:
            return M.decode_server_message(frame)
        except ProtocolError as exc:
            raise ProtocolViolation(f"server sent an invalid message: {exc.message}", field=exc.field) from None

    # ------------------------------------------------------------------ state
    def _save(self) -> None:
        if self.ring is not None:
            self.ring.sync()  # the state never claims items the ring could have lost
        self.state_store.save(self.session.state(whole_snapshots=self.commit_mode == "snapshot"))
        self._last_save = time.monotonic()
        self._dirty = False

    def _maybe_save(self) -> None:
        self._dirty = True
        waited = time.monotonic() - self._last_save
        if waited >= self.commit_interval:
            self._save()
        elif self._idle_save is None:
            # If no frame comes before the interval is over (the stream went idle), save anyway:
            # a consumer stopped by SIGKILL after a quiet spell must not lose what it processed.
            self._idle_save = asyncio.get_running_loop().call_later(self.commit_interval - waited,
                                                                    self._save_when_idle)

    def _save_when_idle(self) -> None:
        """Runs between two steps of the event loop, so the positions are those of processed items."""
        self._idle_save = None
        if self._dirty and not self._closed:
            try:
                self._save()
            except Exception:  # the next save retries; a timer callback has nobody to raise to
                log.exception("consumer %s: saving its position while idle failed", self.name)

    def _apply_batch_progress(self, upto: int) -> None:
        """Move the position over items [_b_done, upto) of the batch being handed over."""
        if self._b_pos is not None and upto > self._b_done:
            self._b_pos.items(self._b_seqnos[self._b_done], self._b_seqnos[upto - 1])
            self.items_processed += upto - self._b_done
            self._b_done = upto

    # ------------------------------------------------------------------ the stream
    def _iterator(self, kind: str) -> AsyncIterator[Any]:
        if self._gen is not None:
            if self._gen_kind != kind:
                raise UsageError("a consumer is iterated one way only: events or batches(), not both")
            return self._gen
        if self._closed:
            raise UsageError("the consumer is closed")
        self._gen_kind = kind
        self._gen = self._stream(per_item=kind == "events")
        return self._gen

    async def _stream(self, per_item: bool) -> AsyncIterator[Any]:
        """All events, across reconnects.  One generator level: every item passes through here."""
        self._iterating = True
        session = self.session
        ring = self.ring
        try:
            if self._ws is None and not self._done:
                await self._open()
            while not self._done and not self._closed:
                try:
                    while True:
                        if self._closed:
                            return
                        if self._seek_reconnect:
                            self._seek_reconnect = False
                            self._seek_requests.clear()  # the handshake requests them
                            raise _Reconnect("a streaming partition was sought to a new position")
                        if self._seek_requests:
                            for p in sorted(self._seek_requests):
                                if p not in session.open and p in session.seeks:
                                    await self._send(session.request_for(p))
                            self._seek_requests.clear()
                        if session.repairs:
                            for plan in list(session.repairs.values()):
                                async for out in self._rollback(plan, repair=True):
                                    yield out
                            continue
                        if session.all_finished:
                            self._done = True
                            self._save()
                            return
                        if self._parts:
                            frame, nbytes = self._parts.popleft()
                        else:
                            ws = self._ws
                            assert ws is not None
                            self._reading = True
                            try:
                                frame = await ws.recv()
                            except ConnectionClosed as exc:
                                if self._closed:  # close() from another task: stop, do not reconnect
                                    return
                                code = exc.rcvd.code if exc.rcvd is not None else None
                                if code in _PROTOCOL_CLOSE_CODES:
                                    raise ProtocolViolation(f"server closed the stream with code {code}: "
                                                            f"{exc.rcvd.reason if exc.rcvd else ''}") from None
                                raise _Reconnect(f"connection closed ({code})") from None
                            finally:
                                self._reading = False
                            nbytes = _frame_bytes(frame)
                            if isinstance(frame, bytes) and frame[:4] == BUNDLE_MAGIC:
                                frame, nbytes = self._unbundle(frame, nbytes)
                        if isinstance(frame, bytes):
                            try:
                                batch = decode_binary(frame)
                            except ProtocolError as exc:
                                raise ProtocolViolation(f"server sent a corrupt batch: {exc.message}", field=exc.field) from None
                            msg: Any = batch
                        else:
                            msg = self._decode_text(frame)

                        if type(msg) is ItemBatch:
                            batch = msg
                            p = batch.partition
                            pos = session.positions.get(p)
                            if pos is None or p not in session.open:
                                raise ProtocolViolation(f"items for partition {p}, which has no open stream", partition=p)
                            seqnos = batch.seqnos
                            n = len(seqnos)
                            cut = False
                            if n:
                                if ring is not None:
                                    ring.append_batch(p, seqnos, batch.keys)  # before anyone applies them
                                self._b_pos, self._b_seqnos, self._b_done = pos, seqnos, 0
                                if per_item:
                                    i = 0
                                    self._b_events = events = events_of(batch)
                                    for event in events:
                                        self._b_i = i
                                        yield event
                                        i += 1
                                else:
                                    self._b_i = n - 1  # the whole batch is handed over at once
                                    yield batch
                                self._apply_batch_progress(self._b_i + 1)  # all, unless a seek cut it
                                cut = self._b_cut
                                self._b_pos, self._b_i, self._b_events, self._b_cut = None, -1, None, False
                            if batch.last and not cut:
                                pos.snapshot_end()
                                yield SnapshotEnd(p, pos.snap_start, pos.snap_end)
                            await self._processed(nbytes)
                            self._maybe_save()
                            continue

                        async for out in self._control(msg, nbytes):  # rare: one more generator level is fine
                            yield out
                except _Reconnect as exc:
                    await self._reconnect(str(exc))
        finally:
            self._iterating = False

    def _unbundle(self, frame: bytes, nbytes: int) -> tuple[str | bytes, int]:
        """Queue a bundle's parts (``engine.protocol.bundle``) and return the first.  Each part
        accounts for its own size and the last one also for the bundle's header bytes, so the
        acknowledgements add up to the message's size once every part is processed."""
        try:
            parts = decode_bundle(frame)
        except ProtocolError as exc:
            raise ProtocolViolation(f"server sent a corrupt bundle: {exc.message}", field=exc.field) from None
        shares = [(part, _frame_bytes(part)) for part in parts]
        last, size = shares[-1]
        shares[-1] = (last, size + nbytes - sum(n for _, n in shares))
        self._parts.extend(shares)
        return self._parts.popleft()

    async def _control(self, msg: Any, nbytes: int) -> AsyncIterator[Event]:
        """Every server message except item batches; events are yielded before bookkeeping that
        must wait until they are processed (acks, barrier futures, stream re-requests)."""
        session = self.session
        kind = type(msg)
        if kind is M.SnapshotMarker:
            pos = session.positions.get(msg.partition)
            if pos is None or msg.partition not in session.open:
                raise ProtocolViolation(f"snapshot for partition {msg.partition}, which has no open stream",
                                        partition=msg.partition)
            pos.snapshot_marker(msg.start, msg.end)
            yield SnapshotStart(msg.partition, msg.start, msg.end, msg.source.value, msg.purge_seqno)
            await self._processed(nbytes)
        elif kind is M.StreamResponse:
            async for out in self._stream_response(msg):
                yield out
            await self._processed(nbytes)
        elif kind is M.StreamEnd:
            p = msg.partition
            if p not in session.positions:
                raise ProtocolViolation(f"stream_end for unknown partition {p}", partition=p)
            action = session.stream_end(p, msg.reason.value, msg.last_seqno)
            yield StreamEnd(p, msg.reason.value, msg.last_seqno, session.lowered_ends.get(p))
            await self._processed(nbytes)
            self._maybe_save()
            if action is EndAction.REREQUEST:
                await self._send(session.request_for(p))
            elif action is EndAction.RECONNECT:
                raise _Reconnect(f"partition {p} stream ended: {msg.reason.value}")
        elif kind is M.BarrierReached:
            event = BarrierReached(msg.cookie, dict(msg.seqnos))
            yield event
            fut = self._barriers.pop(msg.cookie, None)
            if fut is not None and not fut.done():
                fut.set_result(event)
            await self._processed(nbytes)
        elif kind is M.CycleComplete:
            await self._processed(nbytes)
        elif kind is M.Error:
            raise ServerError(f"server error {msg.code}: {msg.message}", server_code=msg.code, field=msg.field,
                              partition=msg.partition)
        else:
            raise ProtocolViolation(f"unexpected {kind.__name__} in the middle of a stream")

    async def _stream_response(self, msg: M.StreamResponse) -> AsyncIterator[Event | ItemBatch]:
        session = self.session
        p = msg.partition
        if p not in session.positions:
            raise ProtocolViolation(f"stream_response for unrequested partition {p}", partition=p)
        status = msg.status
        if status is M.StreamStatus.OK:
            self._not_mine.pop(p, None)
            session.stream_ok(p, msg.failover_log or ())
        elif status is M.StreamStatus.ROLLBACK:
            plan = session.plan_rollback(p, msg.rollback_seqno or 0, msg.reason, msg.detail, msg.failover_log or ())
            async for out in self._rollback(plan):
                yield out
        elif status is M.StreamStatus.NOT_MY_PARTITION:
            session.not_my_partition(p)
            count = self._not_mine[p] = self._not_mine.get(p, 0) + 1
            if count >= MAX_NOT_MY_PARTITION:
                raise StreamRejected(f"partition {p} is not served by {self.server} ({msg.detail or 'not active'})",
                                     status="not_my_partition", partition=p)
            raise _Reconnect(f"partition {p}: not my partition; reloading the partition map")
        else:
            session.range_error(p, msg.detail or msg.field)

    async def _rollback(self, plan: RollbackPlan, repair: bool = False) -> AsyncIterator[Event]:
        """Repair a rollback (or, with ``repair``, unsaved progress found at the handshake):
        corrections from the ring, or a partition reset; then stream the partition.

        Order matters for crash safety: the ring entries above R are replaced and the state saved
        only after every correction was processed; a crash before that repeats the corrections
        (they are idempotent: each is the key's current version)."""
        p = plan.partition
        session = self.session
        log.warning("partition %d: %s to %d (%s): %s", p, "repair" if repair else "rollback", plan.seqno,
                    plan.reason, plan.detail)
        corrected: list[tuple[bytes, int]] = []
        if plan.reset:
            yield PartitionReset(p, plan.seqno, plan.reason)
        else:
            docs = await self._fetch([k.decode() for k in plan.keys])
            high = 0
            if any(doc is None for doc in docs):
                # A 404 does not say at which seqno the key was deleted; the partition's high seqno
                # (read after the GETs) bounds it, so the key stays covered until the stream passes it.
                high = await self._high_seqno(p)
            yield Rollback(p, plan.seqno, plan.reason, plan.detail, len(plan.keys), plan.resume)
            for key, doc in zip(plan.keys, docs):
                if doc is None:
                    yield Deletion(p, plan.seqno, key.decode(), 0, 0, correction=True)
                    if high > plan.seqno:
                        corrected.append((key, high))
                else:
                    yield Mutation(p, doc.seqno, doc.key, doc.value, doc.cas, doc.rev, correction=True)
                    if doc.seqno > plan.seqno:
                        corrected.append((key, doc.seqno))
                self.corrections += 1
        request = session.finish_repair(plan, corrected) if repair else session.finish_rollback(plan, corrected)
        self._save()
        await self._send(request)

    async def _high_seqno(self, partition: int) -> int:
        try:
            return int((await self.http.partition(partition))["high_seqno"])
        except ConnectionFailed as exc:
            raise _Reconnect(f"cannot read partition {partition}: {exc}") from None

    async def _fetch(self, keys: list[str]) -> list[Document | None]:
        sem = asyncio.Semaphore(self.correction_concurrency)

        async def one(key: str) -> Document | None:
            async with sem:
                return await self.http.get(key)

        try:
            return list(await asyncio.gather(*(one(k) for k in keys)))
        except ConnectionFailed as exc:
            raise _Reconnect(f"cannot read corrections: {exc}") from None

