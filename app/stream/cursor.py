"""Reading and encoding one partition's stream: the only stream code that touches the engine.

Theory of operation
-------------------
A ``PartitionCursor`` remembers how far a partition has been *encoded* for one connection and
holds the ``PartitionSnapshot`` being streamed.  ``PartitionCursor.produce`` runs in an executor
thread (never on the event loop): it takes a snapshot when it has none, then encodes the
snapshot's parts as DCP does: for each part a snapshot marker, then the items in seqno order in
batch frames (~64 KiB each), the last frame of the part flagged ``last``.  It stops when the
caller's byte budget is used up, so a connection never encodes more than it may soon send:
server memory per connection is the budget, not the backlog.

Cursor dropping (DCP's answer to slow consumers): a snapshot pins memory (a write-queue root
the flusher would otherwise free) or an LMDB read transaction (which pins pages and blocks map
growth).  When the connection has been blocked on its consumer for too long the adapter calls
``drop``: the snapshot is released and the next ``produce`` re-reads from the last encoded seqno.
If the drop happened mid-snapshot the re-read is sent as one *continuation* snapshot: its marker
starts right after the last item sent (``last_seqno + 1``, as DCP's backfill after a dropped
cursor does) and ends at the new high seqno, which is never below the open snapshot's end; all
parts of the new reading follow in seqno order under that one marker (a key may then appear twice,
older version first), and only the final batch is ``last``.  Items received before the drop plus
the continuation are the latest versions of every key up to the new end, so the consumer is
consistent once the ``last`` batch arrives.  A consumer tracking positions keeps its open
snapshot's start and extends its end (``engine.protocol.client.position``).

A capped consumer (hello ``visibility`` persisted or majority; ``ceiling_of`` given): right
after taking a snapshot the cursor reads the partition's visible ceiling and sends only the
parts the protocol's ``visible_parts`` allows (whole parts at or below it), and ``ceiling`` /
``held_back_to`` tell the session what happened (``ServerSession.end_visit``).  Reading the
ceiling *after* the snapshot matters for ``persisted``: the flusher writes the persisted seqno
with the data, so the ceiling is then at least the disk part's end and the disk part always
goes.  The parts held back stay *pinned* (``held_since``) and go on a later visit once the
ceiling has reached them, as they were read.  WHY keep them rather than read again: under
continuous writes every new reading ends above the ceiling again (a ``majority`` ceiling trails
the high seqno by the replicas' round trip, and a local flush may run ahead of it), so a stream
that re-read each time might never get a reading whose parts all fit.  A pin is bounded like a
stalled consumer's: the connection releases readings held longer than ``drop_after_s``
(``release_held``), and the next visit reads afresh.  A continuation (one marker over every
part) cannot be sent in pieces, so its held parts are released at once.  Tail-cache entries
replay only up to the ceiling.  Uncapped cursors skip all of it.

What the cursor does *not* decide: positions, bounded-stream ends, barriers and flow control
belong to the protocol session (``engine.protocol.session.ServerSession``), and which parts of a
reading open a snapshot and which batch is ``last`` (fresh or continuation) to the protocol's
``plan_reading`` (``engine.protocol.reading_plan``); the cursor only turns snapshots into markers and encoded batches.  A part with no items left (superseded or purged) still
gets its marker and one empty ``last`` batch, so the consumer's position reaches the part's end.

Thread discipline: at most one executor job touches a cursor at a time (the connection awaits
each job before the next); the event loop reads only the plain integer fields for status.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from app.stream.tailcache import CachedSnapshot
from engine.protocol import messages as M
from engine.protocol.frames import Columns
from engine.protocol.reading_plan import PartPlan, plan_reading, visible_parts

__all__ = ["Batch", "BatchEncoder", "Marker", "PartitionCursor", "marker_text"]


@dataclass(slots=True)
class Marker:
    """A snapshot part starts.  The adapter tells the session (``snapshot_marker``) and sends
    ``text``, the same message encoded here, off the event loop."""

    partition: int
    start: int
    end: int
    source: str
    purge_seqno: int
    text: str = ""

    def __post_init__(self) -> None:
        if not self.text:
            self.text = marker_text(self.partition, self.start, self.end, self.source, self.purge_seqno)


_SOURCES = frozenset(s.value for s in M.SnapshotSource)


def marker_text(partition: int, start: int, end: int, source: str, purge_seqno: int) -> str:
    """``M.encode(SnapshotMarker(...))``, the same text, formatted directly.

    WHY: a live tail sends one marker per partition visit and the generic encoder (field table,
    dict, ``json.dumps``) was a quarter of the cost of producing a small visit (profiled); the
    plain-int / known-source case is formatted here, anything else takes the generic path."""
    if (type(partition) is int and type(start) is int and type(end) is int and type(purge_seqno) is int
            and source in _SOURCES):
        return (f'{{"type":"snapshot","partition":{partition},"start":{start},"end":{end},'
                f'"source":"{source}","purge_seqno":{purge_seqno}}}')
    return M.encode(M.SnapshotMarker(partition, start, end, M.SnapshotSource(source), purge_seqno))


@dataclass(slots=True)
class Batch:
    """One encoded item batch frame; ``last`` completes its snapshot."""

    data: str | bytes
    last_seqno: int | None
    last: bool


#: ``frames.encode_binary_columns`` or ``encode_json_columns``: one frame for a ``Columns`` batch.
BatchEncoder = Callable[[int, Columns, bool], "str | bytes"]

_NO_ITEMS = Columns((), (), (), (), (), ())


class PartitionCursor:
    """One partition of one connection: position and the snapshot being encoded (executor side)."""

    def __init__(self, partition: int, position: int, snap_start: int, *,
                 frame_bytes: int = 64 * 1024, frame_items: int = 4096, tailing: bool = False) -> None:
        self.partition = partition
        #: last seqno encoded (== the stream's position once everything encoded is sent)
        self.last_seqno = position
        #: start of the snapshot being encoded (repeated by a continuation marker)
        self.snap_start = snap_start
        #: a marker went out and its ``last`` batch did not (so a re-read continues it)
        self.open_snapshot = False
        self.high_seqno = position
        self.purge_seqno = 0
        self.drops = 0
        self.captured_at = 0.0
        self._frame_bytes = frame_bytes
        self._frame_items = frame_items
        self._snapshot: Any = None
        self._parts: deque[Any] = deque()
        self._part: Any = None
        self._batches: Iterator[Columns] | None = None
        self._lookahead: Columns | None = None
        self._continuing = False  # the current reading continues a snapshot left open by a drop
        self._plans: deque[PartPlan] = deque()  # how each part still to read is sent
        self._plan = PartPlan(None, True)  # ... and the part being read
        #: may replay the tail cache: not before the stream's first reading (see ``produce``)
        self.tailing = tailing
        #: capped streams: the end of the snapshot left open (a continuation may only extend it)
        self.open_end = position
        #: capped streams, for this visit: the ceiling of the last reading, and its end when
        #: parts above the ceiling were held back (both None: uncapped, or no reading taken)
        self.ceiling: int | None = None
        self.held_back_to: int | None = None
        #: capped streams: parts of the pinned reading above the ceiling, their plans, and since when
        self._held: deque[Any] = deque()
        self._held_plans: deque[PartPlan] = deque()
        self.held_since: float | None = None

    @property
    def holding(self) -> bool:
        """True while a snapshot (memory root or LMDB transaction) is pinned by this cursor."""
        return self._snapshot is not None

    def produce(self, snapshot_of: Callable[[int, int], Any], encode: BatchEncoder, budget: int,
                out: list[Marker | Batch], cache: Any = None, codec: str = "",
                high_of: Callable[[int], int] | None = None,
                ceiling_of: Callable[[int], int] | None = None) -> bool:
        """Executor side: append markers and encoded batches to ``out`` until about ``budget``
        bytes are encoded or the snapshot is complete.  Returns True when complete (or idle).

        With a ``TailCache`` (and ``high_of``, the partition's current high seqno after the state
        check), snapshot parts (disk or memory) other connections already encoded from this
        position are replayed first; a fresh snapshot is taken only if the partition has moved past them.

        Not on a stream's first reading: a new stream (a consumer starting or resuming, a backup
        run, a re-request after a rollback) gets the deduplicated state as of now, as before the
        cache, not an old encoded snapshot of its start position followed by everything since
        (valid DCP, but every key changed meanwhile comes twice: a full backup run counted twice
        the items).  Tailing consumers that started together still share: their first readings
        are taken at the same position, and the first of them to read further stores the entries."""
        p = self.partition
        used = 0
        if self._held and ceiling_of is not None and self._batches is None and not self._parts:
            # a reading pinned on an earlier visit: the parts the ceiling has now reached go on
            self.ceiling = ceiling = ceiling_of(p)
            while self._held and self._held[0].end <= ceiling:
                self._parts.append(self._held.popleft())
                self._plans.append(self._held_plans.popleft())
            # This visit began after the reading was taken, and a barrier cookie counts on a
            # visit's reading being taken after it began: so the visit reports as its reading's
            # end the high seqno now, and counts for cookies only once that is delivered too.
            high = max(high_of(p) if high_of is not None else 0, self.high_seqno)
            self.held_back_to = high if self._held or high > self.high_seqno else None
            if not self._parts:
                return True
        elif self._snapshot is None:
            if cache is not None and high_of is not None and not self.open_snapshot and self.tailing:
                replay_to = ceiling_of(p) if ceiling_of is not None else None
                while used < budget:
                    entry = cache.get(codec, p, self.last_seqno)
                    if entry is None or (replay_to is not None and entry.end > replay_to):
                        break
                    out.extend(entry.outputs)
                    used += entry.size
                    self.last_seqno = entry.end
                    self.snap_start = entry.outputs[0].start
                if used >= budget:
                    return False
                high = high_of(p)
                if high <= self.last_seqno:
                    self.high_seqno = self.last_seqno
                    return True
            snap = snapshot_of(p, self.last_seqno)
            self.tailing = True
            self.high_seqno = max(snap.high_seqno, self.last_seqno)
            self.purge_seqno = snap.purge_seqno
            if not snap.parts:
                _close(snap)
                return True
            parts = snap.parts
            self._continuing = self.open_snapshot
            held: list[Any] = []
            if ceiling_of is not None:
                # after the snapshot, so a persisted ceiling covers its disk part (see above)
                self.ceiling = ceiling = ceiling_of(p)
                self.held_back_to = None
                ranges = [(part.start, part.end) for part in parts]
                n = visible_parts(ranges, ceiling, self.open_end if self._continuing else None)
                if n < len(parts):
                    self.held_back_to = snap.high_seqno
                    if not self._continuing:  # pinned until the ceiling reaches them (see above)
                        held = parts[n:]
                    parts = parts[:n]
                    if not parts and not held:
                        _close(snap)
                        return True
            self._snapshot = snap
            self.captured_at = time.monotonic()
            # which parts open a snapshot and which batches are `last`: the protocol's rule
            # (a re-read after a drop mid-snapshot is one continuation snapshot)
            plans = plan_reading([(part.start, part.end) for part in parts + held],
                                 self.last_seqno if self._continuing else None)
            self._parts = deque(parts)
            self._plans = deque(plans[:len(parts)])
            if held:
                self._held = deque(held)
                self._held_plans = deque(plans[len(parts):])
                self.held_since = self.captured_at
                if not parts:
                    return True
        marker_at = -1
        while used < budget:
            if self._batches is None:
                if not self._parts:
                    if not self._held:
                        self._release()
                    return True
                part = self._parts.popleft()
                self._plan = self._plans.popleft()
                marker_at = -1  # a continuation is not a snapshot another position could replay
                if self._plan.marker is not None:
                    if not self._continuing:
                        marker_at = len(out)
                        self.snap_start = part.start
                    out.append(Marker(p, *self._plan.marker, part.source, self.purge_seqno))
                    self.open_end = self._plan.marker[1]
                self.open_snapshot = True
                self._part = part
                self._batches = part.columns(self._frame_items, self._frame_bytes)
                self._lookahead = next(self._batches, None)
                if self._lookahead is None:  # nothing left in the range: an empty last batch
                    self._lookahead = _NO_ITEMS
            batch = self._lookahead
            assert batch is not None and self._batches is not None
            self._lookahead = next(self._batches, None)
            part_done = self._lookahead is None
            last = part_done and self._plan.last
            n = len(batch)
            if n or last:
                data = encode(p, batch, last)
                last_seqno = batch.seqnos[n - 1] if n else None
                out.append(Batch(data, last_seqno, last))
                used += len(data)
                if last_seqno is not None:
                    self.last_seqno = last_seqno
            if part_done:
                _close_iter(self._batches)
                self._batches = None
                if last:
                    self.open_snapshot = False
                    self._continuing = False
                    if cache is not None and marker_at >= 0:
                        outputs = tuple(out[marker_at:])
                        size = sum(len(x.data) for x in outputs if isinstance(x, Batch))
                        cache.put(codec, p, CachedSnapshot(self._part.start - 1, self._part.end, outputs, size))
                    marker_at = -1
                    self.last_seqno = max(self.last_seqno, self._part.end)
                self._part = None
        if self._batches is None and not self._parts:
            if not self._held:
                self._release()
            return True
        return False

    def drop(self) -> bool:
        """Release the pinned snapshot (cursor dropping); the next ``produce`` re-reads from disk
        and memory after ``last_seqno``.  Returns True if something was released."""
        if self._snapshot is None:
            return False
        self._release()
        self.drops += 1
        return True

    def close(self) -> None:
        """Release everything (connection or stream closed)."""
        self._release()

    def release_held(self) -> bool:
        """Release a reading pinned for parts above the ceiling (held too long); the next
        visit reads afresh.  Not a cursor drop: nothing of it was sent.  True if released."""
        if self.held_since is None or self._batches is not None or self._parts:
            return False
        self._release()
        return True

    def _release(self) -> None:
        if self._batches is not None:
            _close_iter(self._batches)
        self._batches = None
        self._lookahead = None
        self._part = None
        self._parts = deque()
        if self.held_since is not None:
            self._held = deque()
            self._held_plans = deque()
            self.held_since = None
        snap, self._snapshot = self._snapshot, None
        if snap is not None:
            _close(snap)


def _close_iter(it: Iterator[Any]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def _close(snapshot: Any) -> None:
    close = getattr(snapshot, "close", None)
    if close is not None:
        close()
