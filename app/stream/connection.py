"""One stream connection: the thin asyncio adapter between a WebSocket and the stream protocol.

Theory of operation
-------------------
Two tasks per connection, both on the event loop:

* the **reader** receives WebSocket messages and feeds them to the protocol session, which
  answers with control replies (queued for the sender), opened/closed streams, barrier cookies
  and flow-control acknowledgements.  It never blocks on the consumer, so acks, cookies and
  WebSocket pongs keep flowing while the sender waits.
* the **sender** owns the socket's outgoing side.  It sends queued control replies first, then
  runs *passes*: a pass visits the connection's streamed partitions in id order; each visit takes
  a snapshot and encodes it in executor threads (``PartitionCursor.produce``, budgeted so that
  only ~``chunk_bytes`` of encoded output exists at a time) and sends it frame by frame, each
  frame waiting for flow-control credit.  With nothing to do it sleeps on one ``asyncio.Event``
  that engine change notifications (``ChangeHub``), acks, control replies and cookies set: no
  busy loop.

A pass visits only partitions that changed since their last visit (the hub says which), unless
a barrier cookie is pending: then it checks every partition with the engine.  A cookie that
arrives during pass *k* is returned at the end of pass *k+1*, the first pass whose every
snapshot was taken after the cookie arrived: so every mutation acknowledged to a writer before
the cookie was sent has been sent before the cookie comes back.

Slow consumers cost bounded memory: encoded output is capped by the chunk budget, unacknowledged
bytes by the window, the socket buffer by uvicorn's write flow control; a snapshot held while the
consumer has not made progress for ``drop_after_s`` is released (cursor dropping) and re-read
from disk later.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from engine.protocol.barrier import BarrierTracker
from engine.protocol.errors import CloseCode, ErrorCode, ProtocolError
from engine.protocol.flow import FlowControl

from app.stream.cursor import Encoded, Encoder, PartitionCursor
from app.stream.hub import ChangeHub
from app.streams_registry import PartitionStreamStatus, StreamStatus

log = logging.getLogger("upr.stream")

__all__ = ["StreamLimits", "StreamConnection"]

# WebSocket close codes
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """Per-connection limits; explicit and configurable (``create_router(limits=...)``)."""

    #: largest client message accepted (a hello naming 65,536 partitions fits); bigger -> error + 1009
    max_message_bytes: int = 1 << 20
    #: window when the client's hello asks for none, and the largest one granted
    default_window_bytes: int = 4 * 1024 * 1024
    max_window_bytes: int = 64 * 1024 * 1024
    min_window_bytes: int = 64 * 1024
    #: encoded output produced per executor job (bounds server memory per connection)
    chunk_bytes: int = 256 * 1024
    #: item frame size target
    frame_bytes: int = 64 * 1024
    frame_items: int = 4096
    #: release a pinned snapshot when the consumer made no progress for this long
    drop_after_s: float = 2.0
    #: most barrier cookies pending at once
    max_pending_barriers: int = 1024


class StreamConnection:
    """Drives one accepted WebSocket; ``run`` returns when the connection is over."""

    def __init__(
        self,
        ws: WebSocket,
        *,
        session: Any,
        engine: Any,
        read: Callable[..., Awaitable[Any]],
        hub: ChangeHub,
        encoder_for: Callable[[str], Encoder],
        limits: StreamLimits,
        remote: str,
        on_rollback: Callable[[str], None] = lambda reason: None,
        on_bytes: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.ws = ws
        self.session = session
        self.engine = engine
        self._read = read
        self.hub = hub
        self._encoder_for = encoder_for
        self.encoder: Encoder | None = None
        self.limits = limits
        self.remote = remote
        self._on_rollback = on_rollback
        self._on_bytes = on_bytes
        self.name = ""
        self.codec = "json"
        self.connected_at = time.time()
        self.cursors: dict[int, PartitionCursor] = {}
        self._dirty: set[int] = set()
        self._control: deque[str | bytes] = deque()
        self.tracker = BarrierTracker(limits.max_pending_barriers)
        self._wake = asyncio.Event()
        self._credit = asyncio.Event()
        self._pass_no = 0
        self._in_pass = False
        self._sent_any_in_pass = False
        self._closing: tuple[int, str] | None = None
        self._peer_closed = False
        self._closed = asyncio.Event()
        self.flow = FlowControl(limits.default_window_bytes)
        self.bytes_sent = 0
        self.last_ack_at = time.monotonic()
        self.cursor_drops = 0
        self._sender: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ hub subscriber
    def notify(self, partitions: frozenset[int]) -> None:
        hit = False
        for p in partitions:
            if p in self.cursors:
                self._dirty.add(p)
                hit = True
        if hit:
            self._wake.set()

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        self.hub.subscribe(self)
        self._sender = asyncio.create_task(self._send_loop(), name=f"stream-send-{self.remote}")
        self._reader = asyncio.create_task(self._read_loop(), name=f"stream-read-{self.remote}")
        try:
            done, _ = await asyncio.wait({self._sender, self._reader}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if exc is not None and not isinstance(exc, (WebSocketDisconnect, ConnectionError)):
                    log.error("stream %s (%s) failed", self.name or "?", self.remote, exc_info=exc)
                    await self._close_now(CLOSE_INTERNAL, "internal error")
        finally:
            self.hub.unsubscribe(self)
            for task in (self._sender, self._reader):
                if task is not None and not task.done():
                    task.cancel()
            for task in (self._sender, self._reader):
                if task is not None:
                    try:
                        await task
                    except BaseException:  # noqa: BLE001 - cancelled or already reported
                        pass
            await self._release_all()
            self._closed.set()

    async def shutdown(self) -> None:
        """Server stopping: every open stream ends with ``shutting_down``, then close 1001."""
        if self._closing is not None:
            return
        if self.encoder is not None:
            for p, cursor in sorted(self.cursors.items()):
                self._control.append(self.encoder.stream_end(p, "shutting_down", cursor.last_seqno))
        self._closing = (CLOSE_GOING_AWAY, "server shutting down")
        self._wake.set()
        self._credit.set()
        try:
            await asyncio.wait_for(self._closed.wait(), timeout=5.0)
        except asyncio.TimeoutError:
            await self._close_now(CLOSE_GOING_AWAY, "server shutting down")

    async def _release_all(self) -> None:
        cursors = list(self.cursors.values())
        self.cursors.clear()
        if cursors:
            try:
                await self._read(_close_cursors, cursors)
            except Exception:  # executor gone at shutdown: drop references instead
                pass

    async def _close_now(self, code: int, reason: str) -> None:
        try:
            await asyncio.wait_for(self.ws.close(code, reason), timeout=2.0)
        except Exception:  # noqa: BLE001 - already closed or peer gone
            pass

    # ------------------------------------------------------------------ reader
    async def _read_loop(self) -> None:
        limit = self.limits.max_message_bytes
        while True:
            message = await self.ws.receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                self._peer_closed = True
                self._closing = self._closing or (message.get("code", 1000), "peer closed")
                self._wake.set()
                self._credit.set()
                return
            text = message.get("text")
            try:
                if text is None:
                    raise ProtocolError(
                        ErrorCode.UNSUPPORTED_DATA,
                        "binary messages are not accepted from clients; send JSON text frames",
                        close_code=CloseCode.UNSUPPORTED_DATA,
                    )
                if len(text) > limit:
                    raise ProtocolError(
                        ErrorCode.MESSAGE_TOO_LARGE,
                        f"message of {len(text)} characters exceeds the limit of {limit} bytes",
                        close_code=CloseCode.MESSAGE_TOO_BIG,
                    )
                await self.session.receive(self, text)
            except ProtocolError as failure:
                self._refuse(failure)
                if failure.close_code is not None:
                    return

    def _refuse(self, failure: ProtocolError) -> None:
        log.info("stream %s (%s): protocol error %s (field %s): %s", self.name or "?", self.remote, failure.code,
                 failure.field, failure.message)
        self._control.append(self.session.error_message(failure))
        if failure.close_code is not None:
            # Close reasons are limited to 123 bytes: name the code and the field.
            reason = f"{failure.code}: {failure.field}" if failure.field else str(failure.code)
            self._closing = (int(failure.close_code), reason[:120])
            self._credit.set()
        self._wake.set()

    # ------------------------------------------------------------------ called by the session
    def reply(self, message: str | bytes) -> None:
        """Queue a control message (sent before further data, counted against the window)."""
        self._control.append(message)
        self._wake.set()

    @property
    def in_flight(self) -> int:
        return self.flow.in_flight

    def set_window(self, window: int) -> None:
        self.flow = FlowControl(window)

    def open_stream(self, cursor: PartitionCursor) -> None:
        self.cursors[cursor.partition] = cursor
        self.tracker.stream_started(cursor.partition)
        self._dirty.add(cursor.partition)
        self._wake.set()

    def _stop_stream(self, partition: int) -> PartitionCursor | None:
        cursor = self.cursors.pop(partition, None)
        self._dirty.discard(partition)
        self.tracker.stream_stopped(partition)
        self._wake.set()  # cookies waiting only on this partition may now be released
        return cursor

    async def close_stream(self, partition: int) -> PartitionCursor | None:
        cursor = self._stop_stream(partition)
        if cursor is not None:
            await self._read(cursor.close)
        return cursor

    def add_barrier(self, cookie: str) -> None:
        self.tracker.add(cookie)  # ProtocolError (not fatal) for a duplicate or too many
        self._wake.set()

    def ack(self, nbytes: int) -> None:
        self.flow.on_ack(nbytes)  # ProtocolError naming ``bytes`` if more than in flight
        self.last_ack_at = time.monotonic()
        if self.flow.can_send:
            self._credit.set()

    def rollback_issued(self, reason: str) -> None:
        self._on_rollback(reason)

    # ------------------------------------------------------------------ sender
    async def _send_loop(self) -> None:
        while True:
            self._release_cookies()
            await self._flush_control()
            if self._closing is not None:
                if not self._peer_closed:
                    await self._close_now(*self._closing)
                return
            if self._pass_due():
                await self._run_pass()
                continue
            self._wake.clear()
            if self._control or self._closing is not None or self._pass_due() or self._cookies_ready():
                continue
            await self._wake.wait()

    def _needs_visit(self, p: int, cursor: PartitionCursor) -> bool:
        return (not cursor.visited or p in self._dirty or cursor.holding or cursor.open_snapshot
                or self.tracker.needs_visit(p))

    def _pass_due(self) -> bool:
        if self.encoder is None:
            return False
        return any(self._needs_visit(p, c) for p, c in self.cursors.items())

    def _cookies_ready(self) -> bool:
        return bool(self.tracker.pending) and not any(self.tracker.needs_visit(p) for p in self.cursors)

    def _release_cookies(self) -> None:
        if not self.tracker.pending:
            return
        ready = self.tracker.release()
        if ready:
            seqnos = {p: c.last_seqno for p, c in sorted(self.cursors.items())}
            for cookie in ready:
                self._control.append(self.session.barrier_message(cookie, seqnos))

    async def _flush_control(self) -> None:
        while self._control:
            await self._transmit(self._control.popleft())

    async def _transmit(self, data: str | bytes) -> None:
        if isinstance(data, str):
            await self.ws.send_text(data)  # ASCII JSON: characters == bytes acknowledged
        else:
            await self.ws.send_bytes(data)
        size = len(data)
        self.flow.on_sent(size)
        self.bytes_sent += size
        self._on_bytes(size)

    async def _run_pass(self) -> None:
        """Visit, in partition id order, every stream with something to check."""
        assert self.encoder is not None
        self._pass_no += 1
        sent_any = False
        for p in sorted(self.cursors):
            cursor = self.cursors.get(p)
            if cursor is None or not self._needs_visit(p, cursor):
                continue
            self._dirty.discard(p)
            if not cursor.visited:
                cursor.visited = sent_any = True
            sent_any |= await self._visit(cursor)
            self._release_cookies()
            await self._flush_control()
            if self._closing is not None:
                return
        if sent_any:
            self._control.append(self.session.cycle_complete_message(self._pass_no))
        self._release_cookies()
        await self._flush_control()

    async def _visit(self, cursor: PartitionCursor) -> bool:
        """Send one partition's new snapshot (if any) completely.  True if anything was sent.

        The visit's barrier token is drawn *before* the snapshot is taken (in the executor), so a
        cookie that arrives while the snapshot is being taken is not satisfied by this visit."""
        assert self.encoder is not None
        p = cursor.partition
        token = self.tracker.begin_visit(p)
        sent = False
        while True:
            out: list[Encoded] = []
            try:
                result = await self._read(
                    cursor.produce, self._snapshot_of, self.encoder, self.limits.chunk_bytes, out
                )
            except StateChanged as changed:
                await self._read(cursor.close)
                self._stop_stream(p)
                self._control.append(self.encoder.stream_end(p, "state_changed", cursor.last_seqno))
                log.info("stream %s: partition %d %s; stream ended", self.name, p, changed)
                return True
            for msg in out:
                if not await self._send_data(msg, cursor):
                    return sent
                sent = True
            if result.ended:
                self._stop_stream(p)
                return sent
            if result.complete:
                self.tracker.end_visit(p, token)
                return sent

    def _snapshot_of(self, partition: int, after_seqno: int) -> Any:
        """Executor side: the partition must still be in the state the stream expected."""
        expected = self.session.expected_state(partition)
        if expected is not None:
            state = self.engine.state(partition).value
            if state != expected:
                raise StateChanged(f"is now {state}, the stream expected {expected}")
        return self.engine.snapshot(partition, after_seqno)

    async def _send_data(self, msg: Encoded, cursor: PartitionCursor) -> bool:
        """Send one data message once the window allows; False if the connection is closing.

        While blocked on the consumer (no credit, or the socket not draining) for longer than
        ``drop_after_s``, the cursor's snapshot is released (cursor dropping)."""
        drop_after = self.limits.drop_after_s
        while not self.flow.can_send:
            if self._closing is not None:
                return False
            if self._control:
                await self._flush_control()
                continue
            self._credit.clear()
            if self.flow.can_send:
                break
            try:
                await asyncio.wait_for(self._credit.wait(), timeout=drop_after)
            except asyncio.TimeoutError:
                await self._maybe_drop(cursor)
        if self._closing is not None:
            return False
        if cursor.holding:
            task = asyncio.ensure_future(self._transmit(msg.data))
            done, _ = await asyncio.wait({task}, timeout=drop_after)
            if not done:
                await self._maybe_drop(cursor)
                await task
            else:
                task.result()
        else:
            await self._transmit(msg.data)
        return True

    async def _maybe_drop(self, cursor: PartitionCursor) -> None:
        if cursor.holding and await self._read(cursor.drop):
            self.cursor_drops += 1
            log.info("stream %s: consumer slow, dropped the snapshot of partition %d at seqno %d "
                     "(re-read from disk when it catches up)", self.name, cursor.partition, cursor.last_seqno)

    # ------------------------------------------------------------------ registry handle
    def to_status(self) -> StreamStatus:
        parts = []
        for p, c in sorted(self.cursors.items()):
            high = max(c.high_seqno, c.last_seqno)
            parts.append(PartitionStreamStatus(partition=p, last_sent_seqno=c.last_seqno, lag=high - c.last_seqno))
        return StreamStatus(
            name=self.name, remote=self.remote, codec=self.codec, partitions=parts,
            bytes_buffered=self.in_flight, barriers_pending=len(self.tracker.pending), connected_at=self.connected_at,
        )


class StateChanged(Exception):
    """The partition left the state the stream was opened for (DCP's StateChanged end)."""


def _close_cursors(cursors: list[PartitionCursor]) -> None:
    for cursor in cursors:
        cursor.close()
