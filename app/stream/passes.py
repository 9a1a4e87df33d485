"""How the sender carries out a pass: produce the visits' snapshots, send them within the window.

Theory of operation
-------------------
``ServerSession.begin_visits`` names the due streams of a pass and begins their visits together.
``PassSender._visit_batch`` first tries a *shared pass* (``_send_shared``): when every visit's
reading is one that other connections at the same positions share (``app.stream.shared``,
``engine.protocol.shared_pass``), the pass is the session's bookkeeping and one bundle of those
bytes.  Otherwise it produces the visits itself: on the event loop when every visit needs only a
few items of the write queue's memory (``Engine.memory_snapshot``: no LMDB, no thread hop), else
in reader-thread jobs of up to ``chunk_bytes`` of encoded output, many visits per job
(``_produce_many``).  Each visit's markers and batches are sent in order, each only once the
window has room (``_wait_for_credit``: the credit wait is timed from its start for cursor
dropping), and the visit ends with ``ServerSession.end_visit``.  A partition found in another
state than its stream expects (checked with every snapshot) ends the stream at once.

``PassSender`` is the sender half of ``StreamConnection`` (connection.py), kept apart because it is
one concept: it uses the connection's session, cursors, outbox, limits and reader-job helpers.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from app.stream.cursor import Batch, BatchEncoder, Marker, PartitionCursor
from engine.protocol import messages as M
from engine.protocol.bundle import bundle_cuts
from engine.protocol.frames import encode_binary_columns, encode_json_columns
from engine.protocol.shared_pass import MarkerStep, shared_fits, take_shared

__all__ = ["ENCODERS", "PassSender", "StateChanged"]

log = logging.getLogger("upr.stream")

ENCODERS: dict[str, BatchEncoder] = {M.Codec.BINARY: encode_binary_columns, M.Codec.JSON: encode_json_columns}


class PassSender:
    """The sender's pass: mixed into ``StreamConnection``, whose state it uses."""

    # the connection's state this half uses (set by StreamConnection.__init__)
    session: Any
    engine: Any
    hub: Any
    limits: Any
    outbox: Any
    cursors: dict[int, PartitionCursor]
    inline_passes: int
    shared_sent: int
    direct_passes: int
    #: shared passes sent as one packed pass (hello ``frames: packed``)
    packed_passes: int
    #: visits carried out without suspending (``_send_visit_now``)
    visits_now: int
    _notified_at: dict[int, float]
    _visit_notified: dict[int, float]
    _visiting: int | None
    #: the sender waits for a wake-up with nothing to do (``_direct_pass`` may act for it)
    _parked: bool
    #: visits ``_direct_pass`` began but could not carry out: the sender's next pass
    _begun: list[Any] | None
    _visiting_cursor: PartitionCursor | None
    _credit_wait_since: float | None
    _close: Any
    _peer_closed: bool
    _ceiling_of: Callable[[int], int] | None
    _wake: asyncio.Event
    _cursor_lock: asyncio.Lock
    _read: Callable[..., Any]
    name: str
    codec: str

    def _carry_out(self, outs: list[Any], wake: bool = True) -> None:
        raise NotImplementedError

    async def _on_reader(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    async def _visit_batch(self, visits: list[Any]) -> None:
        """Carry out visits the session began together (``ServerSession.begin_visits``: the due
        streams of this pass in id order, each with its barrier token drawn before its snapshot
        is taken): one reader-thread job takes the snapshots and encodes them up to the chunk
        budget, then each visit is sent and ended in order.  A busy tail with many partitions
        thus costs one executor hop per wake-up, not one per partition."""
        cursors = [self.cursors[v.partition] for v in visits]
        for v in visits:
            notified = self._notified_at.pop(v.partition, None)
            if notified is not None:
                self._visit_notified[v.partition] = notified
        for v, cursor in zip(visits, cursors):
            cursor.last_seqno = v.after_seqno
        if self._ceiling_of is not None:
            for cursor in cursors:
                cursor.ceiling = cursor.held_back_to = None
        if await self._send_shared(visits, cursors):
            return
        # Sends rarely suspend (the socket buffer takes them), so without these yields one
        # connection's pass would run start to end in one loop step: with many consumers HTTP
        # writes would wait for every pass of a loop iteration (see docs/benchmarks.md, Stream:
        # fan-out).
        yield_every = self.limits.visits_per_yield
        pending = list(zip(visits, cursors))
        if self._produce_inline(cursors, check_only=True) is not None:
            # inline: each visit is produced right before it is sent, so the first partition's
            # frames leave without waiting for the encoding of the others
            for i, (visit, cursor) in enumerate(zip(visits, cursors)):
                produced = self._produce_inline([cursor])
                if produced is None:
                    # the memory no longer covers it (flushed and trimmed during the pass's
                    # yields): this visit and the rest go in reader jobs, many per job, not
                    # one reader-thread hop per visit
                    pending = pending[i:]
                    break
                if self._send_visit_now(visit, cursor, *produced[0]):
                    if self.outbox.queued:
                        await self.outbox.flush_control()  # as _send_item does after a batch
                else:
                    await self._send_visit(visit, cursor, *produced[0])
                if i % yield_every == yield_every - 1:
                    await self.outbox.flush_bundle()  # a tail pass: what is ready goes out at once
                    await asyncio.sleep(0)
            else:
                await self.outbox.flush_control()  # with cycle_complete, if the pass is over
                await self.outbox.flush_bundle()
                return
        await self.outbox.flush_bundle()
        # One job produces visits in order until the chunk budget is used; the visits it did not
        # reach go to the next job, again many at once.  WHY: when each of those made its own
        # reader-thread hop, a consumer a few seconds behind (a few hundred KiB per partition,
        # so the budget covered a handful of the 64 visits) waited for ~60 sequential hops per
        # pass, each queued behind every other connection's jobs: under fan-out such consumers
        # stayed 2-3 s behind the writer with the server's CPU half idle.
        sent = 0
        while pending:
            if sent:
                await self.outbox.flush_bundle(self.limits.mid_pass_flush_bytes)
            produced = await self._on_reader(_produce_many, [c for _, c in pending], self._produce_args(),
                                             self.limits.chunk_bytes)
            if not produced:  # never without progress: the first visit goes on by itself
                produced = [([], False, None)]
            for (visit, cursor), (outs, complete, changed) in zip(pending, produced):
                if self._send_visit_now(visit, cursor, outs, complete, changed):
                    if self.outbox.queued:
                        await self.outbox.flush_control()  # as _send_item does after a batch
                else:
                    await self._send_visit(visit, cursor, outs, complete, changed)
                sent += 1
                if sent % yield_every == 0:
                    # what is ready goes out before others run
                    await self.outbox.flush_bundle(self.limits.mid_pass_flush_bytes)
                    await asyncio.sleep(0)  # let the loop's other work (HTTP writes, other connections) in
            pending = pending[len(produced):]
        await self.outbox.flush_control()
        await self.outbox.flush_bundle()

    async def _send_shared(self, visits: list[Any], cursors: list[PartitionCursor]) -> bool:
        """Carry out the pass from shared readings (``app.stream.shared``), as one bundle, if every
        visit has one and the window takes it all (``engine.protocol.shared_pass.take_shared``
        decides); False: nothing was done, the pass goes the usual way.

        WHY: with many consumers tailing, each connection producing and sending its visits one
        by one (a marker and a batch per partition, each awaited) was most of the event loop's
        time (profiled, docs/benchmarks.md); here a connection at the shared positions costs
        the session's bookkeeping and one send per pass."""
        shared = self.hub.shared
        if (shared is None or not self.limits.shared_passes or self.limits.inline_items <= 0
                or self._ceiling_of is not None or self._cursor_lock.locked() or not self.outbox.bundling
                or self.outbox.bundle_pending):
            return False
        streams = self.session.streams
        codec = self.codec
        readings: list[Any] = []
        from_disk: list[int] = []
        for visit, cursor in zip(visits, cursors):
            stream = streams.get(visit.partition)
            if stream is None or cursor.holding or cursor.open_snapshot:
                return False
            reading = shared.reading(codec, visit.partition, visit.after_seqno, stream.expected_state)
            if reading is None:
                if not shared.may_read(visit.partition, visit.after_seqno):
                    return False
                from_disk.append(len(readings))
            readings.append(reading)
        if from_disk:
            # one reader-thread reading per position for every connection there (shared.read);
            # while this waits, acks, cookies and closes may arrive: everything is checked again
            run = self.hub.jobs.run if self.hub.jobs is not None else self._read
            started = [shared.begin_read(codec, visits[i].partition, visits[i].after_seqno,
                                         streams[visits[i].partition].expected_state, run) for i in from_disk]
            got = [await shared.await_read(one) for one in started]  # all started: they run together
            if any(r is None for r in got) or self._close is not None or self._peer_closed:
                return False
            for i, reading in zip(from_disk, got):
                readings[i] = reading
            for visit, reading in zip(visits, readings):
                stream = streams.get(visit.partition)
                if stream is None or not shared.current(reading, stream.expected_state):
                    return False
            if self._cursor_lock.locked() or self.outbox.bundle_pending:
                return False
        outs = take_shared(self.session, visits, readings, self.limits.bundle_bytes)
        if outs is None:
            return False
        encoded, count, notified, packed = self._shared_sent(readings)
        self.shared_sent += 1
        self._carry_out(outs)
        if count:
            await self.outbox.send_pass(encoded, count, notified, packed)
        else:
            await self.outbox.flush_control()
        return True

    def _direct_pass(self, sender: bool = False) -> bool:
        """Carry out the pass now, on the loop, from shared readings of the write queue's memory,
        without waking the sender task; False: nothing was begun (or the begun visits were handed
        to the sender, ``_begun``), wake the sender.

        WHY: under fan-out every change wakes each connection's sender task (an ``Event``, a
        future, a task step through the pass's coroutines, a new future to wait on again) only
        for it to carry out a shared pass that needs no waiting at all: the session's bookkeeping
        and one transport write.  Called from the hub's delivery (``notify``), this is that pass
        with nothing around it.  Only while the sender is parked with nothing to do (so nothing
        of its own is in flight), the transport takes writes directly, and every due visit has a
        current reading in memory that fits the window; anything else goes the usual way.
        ``sender``: called by the sender task itself, between passes (it was awake when the
        change came): the same pass, instead of beginning the visits one reading at a time."""
        shared = self.hub.shared
        outbox = self.outbox
        if ((not sender and (not self._parked or self._wake.is_set())) or shared is None
                or not self.limits.shared_passes or self.limits.inline_items <= 0
                or self._ceiling_of is not None or self._close is not None or self._peer_closed
                or self._cursor_lock.locked() or outbox.queued or outbox.bundle_pending
                or not outbox.bundling or not outbox.writes_now):
            return False
        session = self.session
        partitions = session.peek_visits(self.limits.max_visits_per_job)
        if not partitions:
            return True  # nothing due (or the window is full): the sender would park again
        streams, cursors = session.streams, self.cursors
        for p in partitions:
            cursor = cursors.get(p)
            if cursor is None or cursor.holding or cursor.open_snapshot:
                return False
        readings = shared.readings(self.codec, partitions, streams)
        if readings is None:
            return False
        # the whole pass at once from the readings' table (the common tail pass), else visit by visit
        outs = session.take_readings(readings, self.limits.bundle_bytes)
        cuts = None
        if outs is not None:
            cuts = bundle_cuts([len(r.parts) for r in readings], self.limits.bundle_bytes)
        else:
            if not shared_fits(session, partitions, readings, self.limits.bundle_bytes):
                return False
            visits = [session.begin_visit(p) for p in partitions]  # what begin_visits would begin: nothing changed
            outs = take_shared(session, visits, readings, self.limits.bundle_bytes)
            if outs is None:  # not expected after shared_fits: the sender carries them out
                self._begun = visits
                return False
        notified_at, visit_notified = self._notified_at, self._visit_notified
        for p in partitions:
            at = notified_at.pop(p, None)
            if at is not None:
                visit_notified[p] = at
        if cuts is not None and len(cuts) > 1:
            # several bundles (as full as each may be); the pass's outputs go after the last
            start = 0
            for end in cuts[:-1]:
                encoded, count, notified, packed = self._shared_sent(readings[start:end])
                outbox.send_pass_now(encoded, count, notified, packed)
                start = end
            readings = readings[start:]
        encoded, count, notified, packed = self._shared_sent(readings)
        self.shared_sent += 1
        self._carry_out(outs, wake=False)
        outbox.send_pass_now(encoded, count, notified, packed)
        self.direct_passes += 1
        if outbox.queued or self._close is not None:
            return False
        # fewer due than the limit: all of them were visited (a pass makes no other stream due)
        return len(partitions) < self.limits.max_visits_per_job or session.next_visit() is None

    def _take_begun(self) -> list[Any]:
        """The visits ``_direct_pass`` began and left to the sender; a visit whose stream ended
        meanwhile (its cursor is gone) ends here."""
        begun, self._begun = self._begun or [], None
        kept = [v for v in begun if v.partition in self.cursors]
        for v in begun:
            if v.partition not in self.cursors:
                self._carry_out(self.session.end_visit(v))
        return kept

    def _shared_sent(self, readings: list[Any]) -> tuple[list[bytes], int, list[float], bool]:
        """The cursors' and notifications' side of a shared pass the session took
        (``take_shared``, ``take_readings``): the readings' parts to send, how many, when their
        changes were notified, and whether they are packed-pass sections (hello ``frames:
        packed`` and every reading packs: ``SharedReading.packed``) rather than bundle parts."""
        encoded: list[bytes] = []
        count = 0
        if self.outbox.packing:
            sections: list[bytes] | None = []
            n = 0
            for reading in readings:
                if reading.count:
                    packed = reading.packed()
                    if packed is None:
                        sections = None
                        break
                    sections.append(packed[0])
                    n += packed[1]
            if sections is not None and n:
                self.packed_passes += 1
                return sections, n, self._shared_cursors(readings), True
        for reading in readings:
            if reading.count:
                encoded.append(reading.parts)
                count += reading.count
        return encoded, count, self._shared_cursors(readings), False

    def _shared_cursors(self, readings: list[Any]) -> list[float]:
        """The cursors' side of a shared pass: each at its reading's end; returns when the
        changes the pass delivers were notified."""
        notified: list[float] = []
        visit_notified = self._visit_notified
        cursors = self.cursors
        for reading in readings:
            p = reading.partition
            cursor = cursors[p]
            cursor.last_seqno = cursor.high_seqno = reading.end
            cursor.tailing = True
            marker = reading.marker
            if marker is not None:
                cursor.snap_start = marker[0]
            else:
                for step in reading.steps:
                    if type(step) is MarkerStep:
                        cursor.snap_start = step.start  # the last part's, as the cursor's own reading leaves it
            at = visit_notified.pop(p, None)
            if at is not None and reading.delivers:
                notified.append(at)
        return notified

    def _send_visit_now(self, visit: Any, cursor: PartitionCursor, out: list[Marker | Batch], complete: bool,
                        changed: "StateChanged | None") -> bool:
        """Carry out a produced visit without suspending, when nothing could make it wait: its
        reading is complete, the window and the pending bundle take all of it, and its stream is
        neither bounded nor capped.  Its markers and batches join the bundle with the session's
        bookkeeping message by message, exactly as ``_send_visit`` does it.  False: nothing was
        done, ``_send_visit`` carries the visit out.

        WHY: a consumer some way behind the tail gets one or two items per partition per pass,
        so its pass is a marker and a batch for each of ~64 visits, and ``_send_visit`` awaits a
        coroutine per message (credit, emit, control flush) although none of them suspends
        then: sent that way, the per-visit machinery, not the items, is most of the sender's
        cost per delivery (profile in docs/benchmarks.md, Peers)."""
        if changed is not None or not complete or cursor.holding or self._ceiling_of is not None:
            return False
        if self._close is not None or self._peer_closed:
            return False
        session = self.session
        p = visit.partition
        stream = session.streams.get(p)
        if stream is None or stream.end_seqno is not None or stream.visiting != visit.token:
            return False
        size = 0
        for item in out:
            size += len(item.text) if type(item) is Marker else len(item.data)  # type: ignore[union-attr]
        flow = session.flow
        outbox = self.outbox
        if not session.can_send or flow is None or flow.available < size or not outbox.bundle_takes(len(out), size):
            return False
        visit_notified = self._visit_notified
        for item in out:
            if type(item) is Marker:
                session.marker_sent(p, item.start, item.end, item.purge_seqno)
                outbox.emit_now(item.text)
                continue
            outbox.emit_now(item.data)  # type: ignore[union-attr]
            if item.last_seqno is not None:  # type: ignore[union-attr]
                notified = visit_notified.pop(p, None)
                if notified is not None:
                    outbox.delivered(notified)
            outs = session.items_sent(p, item.last_seqno, item.last)  # type: ignore[union-attr]
            if outs:
                self._carry_out(outs)
        visit_notified.pop(p, None)
        outs = session.end_visit(visit)
        if outs:
            self._carry_out(outs)
        self.visits_now += 1
        return True

    async def _send_visit(self, visit: Any, cursor: PartitionCursor, out: list[Marker | Batch], complete: bool,
                          changed: "StateChanged | None") -> None:
        session = self.session
        p = visit.partition
        self._visiting = p
        self._visiting_cursor = cursor
        try:
            while True:
                if changed is not None:
                    log.info("stream %s: partition %d %s; stream ended", self.name, p, changed)
                    self._carry_out(session.state_changed(p, changed.state))
                    break
                stopped = False
                for item in out:
                    if not await self._send_item(p, item, cursor):
                        stopped = True  # the stream ended (bounded, closed) or the connection is closing
                        break
                if stopped or complete:
                    break
                out = []
                # a full bundle does not wait for the reader
                await self.outbox.flush_bundle(self.limits.mid_pass_flush_bytes)
                try:
                    snapshot_of, encode, cache, codec, high_of, ceiling_of = self._produce_args()
                    complete = await self._on_reader(cursor.produce, snapshot_of, encode, self.limits.chunk_bytes,
                                                     out, cache, codec, high_of, ceiling_of)
                except StateChanged as exc:
                    changed = exc
        finally:
            self._visiting = None
            self._visiting_cursor = None
            self._visit_notified.pop(p, None)
        if self.cursors.get(p) is not cursor and cursor.holding:
            await self.outbox.flush_bundle()
            await self._on_reader(cursor.close)  # the stream ended during the visit
        if self._ceiling_of is None:
            self._carry_out(session.end_visit(visit))
        else:
            self._carry_out(session.end_visit(visit, ceiling=cursor.ceiling, held_back_to=cursor.held_back_to))

    async def _send_item(self, p: int, item: Marker | Batch, cursor: PartitionCursor) -> bool:
        """Send a marker or batch once the window allows; False if the stream or connection ended."""
        session = self.session
        if not await self._wait_for_credit(cursor):
            return False
        if not session.is_open(p):
            return False
        if isinstance(item, Marker):
            session.marker_sent(p, item.start, item.end, item.purge_seqno)
            data: str | bytes = item.text  # encoded on the reader thread
        else:
            data = item.data
        await self.outbox.emit(data)
        if isinstance(item, Batch):
            if item.last_seqno is not None:
                notified = self._visit_notified.pop(p, None)
                if notified is not None:
                    self.outbox.delivered(notified)
            self._carry_out(session.items_sent(p, item.last_seqno, item.last))
            await self.outbox.flush_control()
            return session.is_open(p)
        return True

    async def _wait_for_credit(self, cursor: PartitionCursor) -> bool:
        """Wait until the window has room (control replies still go out meanwhile).  The wait
        is timed from its start: wake-ups that bring no credit (engine notifications) and control
        replies sent meanwhile do not restart the clock cursor dropping reads."""
        if self.session.can_send:
            return self._close is None and not self._peer_closed
        self._credit_wait_since = time.monotonic()
        try:
            while not self.session.can_send:
                if self._close is not None or self._peer_closed:
                    return False
                if self.outbox.bundle_pending:
                    await self.outbox.flush_bundle()  # the consumer can only acknowledge what it received
                    continue
                if self.outbox.queued:
                    await self.outbox.flush_control()
                    continue
                self._wake.clear()
                if not self.session.can_send:
                    await self._wake.wait()
        finally:
            self._credit_wait_since = None
        return self._close is None and not self._peer_closed

    def _waiting_since(self) -> float | None:
        """Since when the sender has been waiting for the consumer (None: it is not)."""
        send, credit = self.outbox.send_since, self._credit_wait_since
        if send is None:
            return credit
        return send if credit is None else min(send, credit)

    def _produce_inline(self, cursors: list[PartitionCursor], check_only: bool = False
                        ) -> list[tuple[list[Marker | Batch], bool, StateChanged | None]] | None:
        """Produce the pass on the loop when every visit needs only a few items of the write
        queue's memory (``Engine.memory_snapshot``: no LMDB, no thread hop); None means "use a reader thread".
        Synchronous, so no reader-thread job can touch these cursors meanwhile (checked: none is
        running).  If the queue was flushed past a position in between, that cursor stops
        incomplete (``_NotInMemory``) and its visit continues on a reader thread.  ``check_only``:
        only whether the pass qualifies (an empty list if it does)."""
        limit = self.limits.inline_items
        if limit <= 0 or self._cursor_lock.locked() or self.engine.closed or self._ceiling_of is not None:
            return None
        total = 0
        for cursor in cursors:
            if cursor.holding or cursor.open_snapshot:
                return None
            n = self.engine.memory_backlog(cursor.partition, cursor.last_seqno)
            if n is None:
                return None
            total += n
            if total > limit:
                return None
        if check_only:
            return []
        args = (self._memory_snapshot_of, ENCODERS[self.codec], self.hub.cache, self.codec, self._high_of)
        self.inline_passes += 1
        return _produce_many(cursors, args, self.limits.chunk_bytes)

    def _memory_snapshot_of(self, partition: int, after_seqno: int) -> Any:
        """Loop side: ``_snapshot_of`` for a snapshot with no disk part, else ``_NotInMemory``."""
        self._check_state(partition)
        snap = self.engine.memory_snapshot(partition, after_seqno)
        if snap is None:
            raise _NotInMemory(partition)
        return snap

    def _produce_args(self) -> tuple[Any, BatchEncoder, Any, str, Callable[[int], int], Callable[[int], int] | None]:
        return self._snapshot_of, ENCODERS[self.codec], self.hub.cache, self.codec, self._high_of, self._ceiling_of

    def _high_of(self, partition: int) -> int:
        """Executor side: the partition's high seqno, after the same state check as a snapshot."""
        self._check_state(partition)
        return self.engine.high_seqno(partition)

    def _check_state(self, partition: int) -> None:
        stream = self.session.streams.get(partition)
        if stream is not None:
            state = self.engine.state(partition)
            if state != stream.expected_state:
                raise StateChanged(state, f"is now {state}, the stream expected {stream.expected_state}")

    def _snapshot_of(self, partition: int, after_seqno: int) -> Any:
        """Executor side: the partition must still be in the state the stream expected."""
        self._check_state(partition)
        return self.engine.snapshot(partition, after_seqno)


class StateChanged(Exception):
    """The partition left the state the stream was opened for (DCP's StateChanged end)."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state


class _NotInMemory(Exception):
    """Inline production only: the position is no longer covered by the write queue's memory."""


def _produce_many(cursors: list[PartitionCursor], args: tuple[Any, ...],
                  budget: int) -> list[tuple[list[Marker | Batch], bool, StateChanged | None]]:
    """Reader thread: produce for each cursor in order until the budget is used; a cursor left
    incomplete ends the job (the ones after it get nothing yet: the pass hands them to the next job)."""
    results: list[tuple[list[Marker | Batch], bool, StateChanged | None]] = []
    used = 0
    for cursor in cursors:
        out: list[Marker | Batch] = []
        try:
            complete = cursor.produce(args[0], args[1], budget - used, out, *args[2:])
        except StateChanged as changed:
            results.append((out, True, changed))
            continue
        except _NotInMemory:
            results.append((out, False, None))  # the visit goes on with a reader-thread job
            break
        results.append((out, complete, None))
        used += sum(len(x.data) for x in out if isinstance(x, Batch))
        if not complete or used >= budget:
            break
    return results
