"""Shared passes: one encoded reading of a partition, sent as-is to every connection at its position.

Theory of operation
-------------------
When many consumers tail the same partitions they are, most of the time, at the same position of
each: every write moves all of them from the same ``after`` to the same new high seqno.  What a
visit sends then depends only on ``(codec, partition, after)`` and the partition's contents, not
on the connection: the same ``snapshot`` marker and the same item batch bytes.  A
``SharedReading`` is that visit's output, read and encoded once (by the adapter, from the write
queue's memory) and laid out as bundle parts (``bundle.encode_parts``), so each connection's
pass is a few dictionary updates here and one ``b"".join`` of shared bytes.

``take_shared`` decides, for the visits ``ServerSession.begin_visits`` began, whether the pass
can be carried out from shared readings, and if so does the session's bookkeeping exactly as the
one-visit-at-a-time path does it (``marker_sent``, ``items_sent``, ``end_visit`` in visit
order), so positions, snapshot ranges, bounded-stream ends, barrier cookies and
``cycle_complete`` come out the same.  It refuses (returns None, changing nothing) when any
visit is not at its reading's ``after``, a stream is in the middle of a snapshot or capped by a
visible ceiling, a bounded stream could end before a reading's last message, or the whole pass
does not fit the flow-control window.  A refused pass goes the usual way (per-connection
production, waiting for credit), which is how a consumer that fell behind catches up on its own;
once it is back at the shared positions its passes are shared again.

The tail's common pass is cheaper still: when every reading is one marker and one ``last`` batch
(``SharedReading.one_batch``) or idle, ``ServerSession.take_readings`` begins, carries out and
ends all its visits in one call from the readings' fields (no ``Visit`` per partition), with the
same resulting state as ``begin_visit`` + ``take_shared``, and the parts may span several bundles
(``bundle.bundle_cuts``).  It refuses more (a pending cookie, any bounded stream), and a refused
pass comes here.

Barrier cookies stay exact because a reading is only offered while it is current: the adapter
uses one only while the partition's high seqno still equals the reading's end, so it is what a
snapshot taken at the visit's start would hold (a write to the partition always advances its
high seqno).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from typing import Any

from engine.protocol.bundle import OVERHEAD, PART
from engine.protocol.packed import pack_messages, section_bytes
from engine.protocol.session import Output, ServerSession, Stream, Visit

#: bytes a packed pass adds that bundled parts do not: its own header and its part header
PACKED_EXTRA = OVERHEAD + PART.size

__all__ = ["PACKED_EXTRA", "BatchStep", "MarkerStep", "SharedReading", "idle_reading", "shared_fits", "take_shared"]


@dataclass(frozen=True, slots=True)
class MarkerStep:
    """A ``snapshot`` marker among a reading's messages."""

    start: int
    end: int
    purge_seqno: int


@dataclass(frozen=True, slots=True)
class BatchStep:
    """An item batch among a reading's messages (``last``: it completes its snapshot)."""

    last_seqno: int | None
    last: bool


class SharedReading:
    """``partition`` read after ``after`` up to ``end`` (its high seqno then), encoded once.

    ``steps`` describe the messages in order; ``parts`` are the same messages laid out as bundle
    parts (``count`` of them, ``size`` bytes of messages, what flow control counts for them).

    The tail's common reading is one snapshot marker and one ``last`` batch (``one_batch``): it
    keeps the marker's ``(start, end, purge_seqno)`` in ``marker`` and the batch's last seqno in
    ``last_seqno``, and makes ``steps`` only when asked.  WHY: such readings are made for every
    partition a write touched, and three frozen objects per reading cost more than formatting
    its marker (``bench.bench_tail_pass``); ``ServerSession.take_readings`` reads the two fields
    directly."""

    __slots__ = ("partition", "after", "end", "_steps", "parts", "count", "size", "delivers", "marker", "last_seqno",
                 "messages", "_packed")

    partition: int
    after: int
    end: int
    parts: bytes
    count: int
    size: int
    #: whether the reading carries items (an idle visit sends nothing); computed once, read by
    #: every connection the reading is shared with
    delivers: bool
    #: a one-batch reading's marker ``(start, end, purge_seqno)``; None for any other reading
    marker: tuple[int, int, int] | None
    #: a one-batch reading's last seqno (None for any other reading)
    last_seqno: int | None
    #: the messages as ``packed.pack_messages`` takes them (set by the adapter that encoded them;
    #: None: the reading is never packed)
    messages: tuple[tuple[Any, ...], ...] | None

    def __init__(self, partition: int, after: int, end: int, steps: tuple[MarkerStep | BatchStep, ...],
                 parts: bytes, count: int, size: int) -> None:
        self.partition, self.after, self.end = partition, after, end
        self._steps: tuple[MarkerStep | BatchStep, ...] | None = tuple(steps)
        self.parts, self.count, self.size = parts, count, size
        self.delivers = any(isinstance(s, BatchStep) and s.last_seqno is not None for s in steps)
        self.marker = None
        self.last_seqno = None
        self.messages = None
        self._packed: tuple[bytes, int] | None | bool = False

    @classmethod
    def one_batch(cls, partition: int, after: int, end: int, marker: tuple[int, int, int], last_seqno: int,
                  parts: bytes, size: int) -> "SharedReading":
        """A reading of one ``snapshot`` marker (``marker``: start, end, purge seqno) and one
        ``last`` batch ending at ``last_seqno``, laid out in ``parts``."""
        self = cls.__new__(cls)
        self.partition, self.after, self.end = partition, after, end
        self._steps = None
        self.parts, self.count, self.size = parts, 2, size
        self.delivers = True
        self.marker = marker
        self.last_seqno = last_seqno
        self.messages = None
        self._packed = False
        return self

    def packed(self) -> tuple[bytes, int] | None:
        """The reading as packed-pass sections (``engine.protocol.packed``): their bytes and
        count, made on first use and kept (shared like ``parts``); None when it is not packed:
        no messages given, a marker without a batch, or sections larger than the bundle parts
        (the window and bundle checks count ``parts``, which packing must never exceed)."""
        packed = self._packed
        if packed is False:
            packed = None
            if self.messages is not None and self.count:
                sections = pack_messages(self.messages)
                if sections is not None:
                    data = b"".join([section_bytes(*s) for s in sections])
                    if len(data) + PACKED_EXTRA <= len(self.parts):
                        packed = (data, len(sections))
            self._packed = packed
        return packed  # type: ignore[return-value]

    @property
    def steps(self) -> tuple[MarkerStep | BatchStep, ...]:
        steps = self._steps
        if steps is None:
            assert self.marker is not None
            steps = self._steps = (MarkerStep(*self.marker), BatchStep(self.last_seqno, True))
        return steps

    def __repr__(self) -> str:
        return (f"SharedReading(partition={self.partition}, after={self.after}, end={self.end}, "
                f"steps={self.steps!r}, count={self.count}, size={self.size})")


def idle_reading(partition: int, after: int) -> SharedReading:
    """Nothing after ``after``: the visit sends nothing and ends (a barrier's or a spurious visit)."""
    return SharedReading(partition, after, after, (), b"", 0, 0)


def _takes_whole(stream: Stream, reading: SharedReading) -> bool:
    """Whether ``stream`` may take ``reading`` whole, as every connection at its position does:
    not inside a snapshot of its own, no visibility ceiling, not held, and no end seqno the
    reading could pass (such a stream could end before its last message: it is sent message by
    message)."""
    if stream.in_snapshot or stream.ceiling is not None or stream.held:
        return False
    return stream.end_seqno is None or stream.end_seqno >= reading.end or not reading.count


def shared_fits(session: ServerSession, partitions: Sequence[int], readings: Sequence[SharedReading],
                max_bytes: int) -> bool:
    """Whether visits of ``partitions`` (``ServerSession.peek_visits``), not begun yet, could be
    carried out from ``readings`` (one each, same order): what ``take_shared`` will accept once
    they are begun, if nothing happens in between.  WHY before: an adapter that carries the
    pass out outside its sender (on the hub's delivery) must not begin visits it then cannot end."""
    if len(partitions) != len(readings) or not partitions or not session.can_send:
        return False
    flow = session.flow
    assert flow is not None
    total = OVERHEAD
    streams = session.streams
    for p, reading in zip(partitions, readings):
        stream = streams.get(p)
        if (stream is None or reading.partition != p or reading.after != stream.position
                or stream.visiting is not None or not _takes_whole(stream, reading)):
            return False
        total += len(reading.parts)
    return total <= flow.available and total <= max_bytes


def take_shared(session: ServerSession, visits: Sequence[Visit], readings: Sequence[SharedReading],
                max_bytes: int) -> list[Output] | None:
    """Carry out ``visits`` (begun together, in order) from ``readings`` (one each, same order):
    the session's bookkeeping of every message and the end of every visit, returning its outputs
    (barrier releases, stream ends, ``cycle_complete``) for the adapter to send after the readings'
    parts, all of which go in one bundle of at most ``max_bytes``.  None: not possible (see the
    module docstring); the session is unchanged."""
    if len(visits) != len(readings) or not visits or not session.can_send:
        return None
    flow = session.flow
    assert flow is not None
    total = OVERHEAD
    streams = session.streams
    for visit, reading in zip(visits, readings):
        stream = streams.get(visit.partition)
        if (stream is None or reading.partition != visit.partition or reading.after != visit.after_seqno
                or stream.visiting != visit.token or not _takes_whole(stream, reading)):
            return None
        total += len(reading.parts)
    if total > flow.available or total > max_bytes:
        return None
    out: list[Output] = []
    for visit, reading in zip(visits, readings):
        p = visit.partition
        for step in reading.steps:
            if type(step) is MarkerStep:
                session.marker_sent(p, step.start, step.end, step.purge_seqno)
            else:
                out += session.items_sent(p, step.last_seqno, step.last)
        out += session.end_visit(visit)
    return out
