"""The consumer's receive side: the stream loop that moves server messages from the connection
into ``ClientSession.receive`` and carries out the actions it returns.

Processed, not received: an event counts as processed when the consumer is asked for the next one
(or the handler given to ``run`` returned, or ``commit()`` is called while handling it).  Only then
do positions move, bytes get acknowledged and state become eligible for saving, so a crash at any
point resumes at or before the first unprocessed item, never after it (dcp.md §3.4), and a slow
handler slows the server instead of filling memory (flow control, §3.6).

The ring (``clients.ring``) gets a batch's keys before the batch is handed over, so a rollback can
be repaired key by key later (``clients.repair``).  Item batches take a fast path here (one
generator level, the position moved once per batch); every other message goes through the
generic action loop.

``ReceiveLoop`` is the part of ``Consumer`` (``clients.consumer``: the public API) that runs the
stream; it holds no state of its own.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed

from engine.protocol import messages as M
from engine.protocol.client.actions import Action, Deliver, Moved, Reconnect, Repair, Send, StreamEnded
from engine.protocol.client.session import ClientSession
from engine.protocol.frames import ItemBatch

from .backoff import Backoff
from .connection import ReconnectNeeded, StreamConnection
from .errors import ConnectionFailed, ProtocolViolation
from .events import (
    BarrierReached,
    Deletion,
    Mutation,
    PartitionMoved,
    SnapshotEnd,
    SnapshotStart,
    StreamEnd,
    events_of,
)
from .http import AsyncHttpApi
from .repair import repair_events
from .ring import RollbackRing
from .state import StateStore

if TYPE_CHECKING:
    from engine.protocol.client.position import PartitionPosition

__all__ = ["ReceiveLoop"]

log = logging.getLogger("upr.client")


class ReceiveLoop:
    """The stream loop of ``Consumer`` (see the module docstring)."""

    # set by Consumer.__init__
    session: ClientSession
    ring: RollbackRing | None
    state_store: StateStore
    @property
    def http(self) -> AsyncHttpApi:  # Consumer's, made when first needed
        raise NotImplementedError
    backoff: Backoff
    name: str
    url: str
    token: str | None
    codec: M.Codec
    bundle: bool
    frames: M.Frames
    visibility: M.Visibility
    commit_mode: str
    commit_interval: float
    max_reconnect_attempts: int | None
    open_timeout: float
    ping_interval: float | None
    max_frame_bytes: int
    correction_concurrency: int
    reconnects: int
    items_processed: int
    corrections: int
    _conn: StreamConnection | None
    _probe_cluster: bool
    _cluster: Any
    _closed: bool
    _done: bool
    _iterating: bool
    _pending: deque[Action]
    _barriers: dict[str, asyncio.Future[BarrierReached]]
    _seek_requests: set[int]
    _seek_reconnect: bool
    _last_save: float
    _dirty: bool
    _idle_save: asyncio.TimerHandle | None
    _b_pos: PartitionPosition | None
    _b_seqnos: Sequence[int]
    _b_done: int
    _b_i: int
    _b_events: Any
    _b_cut: bool

    async def _discover(self) -> None:  # Consumer's: is the server a cluster?
        raise NotImplementedError

    async def _discover_once(self) -> None:  # Consumer's: ``_discover``, shared by every caller
        raise NotImplementedError

    # ------------------------------------------------------------------ connection
    async def _open(self) -> None:
        conn = await StreamConnection.open(self.url, self.token, open_timeout=self.open_timeout,
                                           max_frame_bytes=self.max_frame_bytes, ping_interval=self.ping_interval)
        session = self.session
        try:
            await conn.send(session.hello(self.name, self.codec, bundle=self.bundle, visibility=self.visibility,
                                          frames=self.frames))
            first, nbytes = await conn.first(self.open_timeout)
            actions = session.receive_handshake(first, nbytes)
            # requests go out at once; repairs of unsaved progress run in the stream loop (they
            # hand events over), and their partitions are requested when they are done
            self._pending = deque(a for a in actions if type(a) is not Send)
            for action in actions:
                if type(action) is Send:
                    await conn.send(action.message)
            for cookie, fut in self._barriers.items():
                if not fut.done():
                    await conn.send(M.Barrier(cookie))
        except ConnectionClosed as exc:
            await conn.close()
            raise ConnectionFailed(f"{self.url}: connection closed during the handshake: {exc}") from None
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        if not session.open and not self._pending:
            self._done = session.all_finished

    async def _reconnect(self, why: str) -> None:
        """Drop the connection and handshake again, with capped exponential backoff and jitter."""
        self.session.connection_lost()
        self._pending.clear()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()  # the rest of a bundle of the old connection is not processed
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
        assert self._conn is not None
        await self._conn.send(msg)

    async def _send_quiet(self, msg: Any) -> None:
        if self._conn is not None:
            await self._conn.send_quiet(msg)

    async def _processed(self, nbytes: int) -> None:
        ack = self.session.processed(nbytes)
        if ack is not None:
            await self._send_quiet(ack)

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
    async def _stream(self, per_item: bool) -> AsyncIterator[Any]:
        """All events, across reconnects.  One generator level: every item passes through here."""
        self._iterating = True
        session = self.session
        ring = self.ring
        try:
            await self._discover_once()
            if self._cluster is not None:  # a cluster: one connection per node (clients.cluster)
                async for x in self._cluster.stream(per_item):
                    yield x
                return
            if self._conn is None and not self._done:
                await self._open()
            while not self._done and not self._closed:
                try:
                    while True:
                        if self._closed:
                            return
                        if self._seek_reconnect:
                            self._seek_reconnect = False
                            self._seek_requests.clear()  # the handshake requests them
                            raise ReconnectNeeded("a streaming partition was sought to a new position")
                        if self._seek_requests:
                            for p in sorted(self._seek_requests):
                                if p not in session.open and p in session.seeks:
                                    await self._send(session.request_for(p))
                            self._seek_requests.clear()
                        if self._pending:
                            async for out in self._carry_out(self._pending.popleft()):
                                yield out
                            continue
                        if session.all_finished:
                            self._done = True
                            self._save()
                            return
                        conn = self._conn
                        assert conn is not None
                        try:
                            msg, nbytes = await conn.receive()
                        except ReconnectNeeded:
                            if self._closed:  # close() from another task: stop, do not reconnect
                                return
                            raise
                        actions = session.receive(msg)

                        if type(msg) is ItemBatch:
                            batch = msg
                            p = batch.partition
                            pos = session.positions[p]
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
                                start, end = session.snapshot_done(p)
                                yield SnapshotEnd(p, start, end)
                            await self._processed(nbytes)
                            self._maybe_save()
                            continue

                        for action in actions:  # rare: one more generator level is fine
                            async for out in self._carry_out(action):
                                yield out
                        await self._processed(nbytes)
                except ReconnectNeeded as exc:
                    await self._reconnect(str(exc))
        finally:
            self._iterating = False

    async def _carry_out(self, action: Action) -> AsyncIterator[Any]:
        """One action of the session; events are yielded before bookkeeping that must wait until
        they are processed (barrier futures, saves, stream re-requests)."""
        kind = type(action)
        if kind is Deliver:
            msg = action.message  # type: ignore[union-attr]
            if type(msg) is M.SnapshotMarker:
                yield SnapshotStart(msg.partition, msg.start, msg.end, msg.source.value, msg.purge_seqno)
            elif type(msg) is M.BarrierReachedMessage:
                event = BarrierReached(msg.cookie, dict(msg.seqnos))
                yield event
                fut = self._barriers.pop(msg.cookie, None)
                if fut is not None and not fut.done():
                    fut.set_result(event)
            else:  # pragma: no cover - the session delivers nothing else outside the batch fast path
                raise ProtocolViolation(f"unexpected {type(msg).__name__} in the middle of a stream")
        elif kind is StreamEnded:
            yield StreamEnd(action.partition, action.reason, action.last_seqno,  # type: ignore[union-attr]
                            action.lowered_from)  # type: ignore[union-attr]
            self._maybe_save()
        elif kind is Send:
            await self._send(action.message)  # type: ignore[union-attr]
        elif kind is Repair:
            async for out in self._repair(action):  # type: ignore[arg-type]
                yield out
        elif kind is Reconnect:
            raise ReconnectNeeded(action.reason)  # type: ignore[union-attr]
        elif kind is Moved:  # only a session following the map (clients.cluster) returns it
            yield PartitionMoved(action.partition, action.reason, self.session.node_id,  # type: ignore[union-attr]
                                 action.detail)  # type: ignore[union-attr]
            self._maybe_save()

    async def _repair(self, action: Repair) -> AsyncIterator[Any]:
        """Carry out a rollback (or, ``unsaved``, a repair of progress found at the handshake),
        then stream the partition.

        Order matters for crash safety: the ring entries above R are replaced and the state saved
        only after every correction was processed; a crash before that repeats the corrections
        (they are idempotent: each is the key's current version)."""
        plan = action.plan
        log.warning("partition %d: %s to %d (%s): %s", plan.partition, "repair" if action.unsaved else "rollback",
                    plan.seqno, plan.reason, plan.detail)
        corrected: list[tuple[bytes, int]] = []
        async for event in repair_events(plan, self.http, self.correction_concurrency, corrected):
            yield event
            if type(event) is Mutation or type(event) is Deletion:
                self.corrections += 1
        session = self.session
        request = session.finish_repair(plan, corrected) if action.unsaved else session.finish_rollback(plan, corrected)
        self._save()
        await self._send(request)
