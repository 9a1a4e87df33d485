"""The server side of one stream connection, sans-I/O.

Theory of operation
-------------------
``ServerSession`` owns every protocol decision for one WebSocket connection and does no I/O: the
adapter (``app/stream*``) feeds it what the client sent and what the engine knows, and carries out
what it returns.  Every input method returns a list of *outputs*, in order:

* a server message (``engine.protocol.messages``): encode it and send it as a text frame;
* ``LookupPartitions(partitions)``: read ``PartitionInfo`` for them from the engine, then call
  ``partitions_info(infos)`` (answers ``hello`` with ``failover_logs``);
* ``LookupStream(partition)``: read that partition's ``PartitionInfo`` *now*, then call
  ``stream_info(partition, info)`` (answers ``stream_request``: the rollback check needs fresh
  failover log, high seqno and purge seqno);
* ``Close(code, reason)``: send the close frame and stop; the session ignores further input.

Adapter API (everything else is internal)::

    session = ServerSession(node_id=..., partition_count=..., limits=ProtocolLimits())
    # client input
    session.receive_text(text) / session.receive_binary(data) / session.receive_message(msg)
    # answers to lookups
    session.partitions_info({p: PartitionInfo, ...}) ; session.stream_info(p, PartitionInfo)
    # engine facts
    session.notify(p)                      # new mutations queued on p (engine listener)
    session.state_changed(p, state)        # the engine's state of p now: may end its stream
    session.end_stream(p, StreamEndReason) # state changed, cursor dropped (too_slow), ...
    session.hello_timeout(seconds)         # the adapter's hello timer fired: error + Close(1008)
    session.shutdown()                     # server going away: stream_end for all + Close(1001)
    # the stream loop
    p = session.next_visit()               # None: nothing to do (or window full); wait for input
    visit = session.begin_visit(p)         # then snapshot = engine.snapshot(p, visit.after_seqno)
    visits = session.begin_visits(n)       # or: up to n due visits of the pass at once, in id order
    marker = session.snapshot_marker(p, part.start, part.end, part.source, snapshot.purge_seqno)
    outs = session.items_sent(p, last_seqno, last)   # after each batch frame (may end the stream)
    outs = session.end_visit(visit)        # barrier releases, cycle_complete
    outs = session.end_visit(visit, ceiling=c, held_back_to=e)  # a capped visit (see Visibility)
    session.visible_ceiling(p, seqno)      # engine fact: p's visible ceiling advanced
    session.sent(nbytes)                   # after EVERY frame sent once hello was received
    session.can_send                       # flow control: start another frame only if True

The stream loop
~~~~~~~~~~~~~~~
Open streams are visited in passes, in partition id order.  A stream is *due* when it has never
been visited, when ``notify`` reported new mutations since its last visit began, or when a pending
barrier cookie still needs a visit of it.  A visit takes the partition's snapshot after the
stream's position, sends a ``snapshot`` marker and the item batches of each snapshot part (or
nothing: an idle visit), and ends.  When a visit ends and no stream with a higher id is due, the
pass is over and the session emits ``cycle_complete``; the next due stream starts a new pass from
the lowest id.  ``next_visit`` returns None when nothing is due or the flow-control window is full:
the adapter then waits for input (a ``notify``, a message, an ack) instead of polling.

A stream's position is the last seqno sent; after the last batch of a snapshot it becomes the
snapshot's end (DCP: a consumer holding a whole snapshot resumes with start = snap_end).  A
bounded stream (``end_seqno``, or ``to_now`` = the high seqno at request time) ends with
``stream_end(end_seqno_reached)`` once a *complete* snapshot reaches its end seqno.

Visibility
~~~~~~~~~~
A ``persisted`` or ``majority`` consumer (hello ``visibility``) must never receive a write above
its partition's *visible ceiling*: the persisted seqno, or the seqno a majority of the copies
hold.  The session never reads a ceiling; the adapter reads it right after taking a visit's
snapshot, sends only the parts at or below it (``reading_plan.visible_parts``: parts go whole),
and reports both with ``end_visit(visit, ceiling=c, held_back_to=e)`` (``e``: the reading's end,
when parts above the ceiling were held back), and later ceilings with ``visible_ceiling``.  Then:

* markers never promise more than the consumer gets: a marker's end is a part's end, at or
  below the ceiling, so an unclean restart or a failover never makes such a consumer roll back;
* a stream that held items back stays dirty, but is visited again only once its ceiling has
  reached the end of that reading (an earlier visit would hold the same parts back again): new
  writes above the ceiling cost no visits, and a ceiling advance wakes it;
* a barrier comes back only once every partition was streamed past it *as this consumer sees
  it*: a visit that held items back does not count for cookies until the stream's position has
  reached that visit's reading end (everything written before the cookie is then delivered),
  so a cookie waits for persistence or a majority.  A cookie still draws a visit even when the
  stream waits at its ceiling: with nothing held back, that visit completes it at once.

A ``memory`` consumer has no ceiling (``Stream.ceiling`` stays None): none of this runs for it.

Connection states (transitions as a table, ``_ALLOWED``)::

    state         accepts                                          on anything else
    ------------  -----------------------------------------------  --------------------------------
    EXPECT_HELLO  hello (hello_timeout(): error hello_timeout)     error wrong_order + Close(1008)
    STREAMING     stream_request, close_stream, barrier, ack       hello: duplicate_hello + Close
    CLOSED        nothing (input ignored)                          -

Errors: connection-level faults (malformed JSON, unknown type or field, wrong order, a second
hello, bad hello values, an impossible ack, binary frames, oversized frames) produce an ``error``
message naming the field and a ``Close`` (1008 protocol error; 1003 unsupported data or protocol
version; 1009 too big).  Faults confined to one stream request (partition out of range or not in
the hello set, duplicate stream, closing a stream that is not open, duplicate cookie) produce an
``error`` only; the connection and its other streams carry on.  Requests for healthy partitions
proceed even when others must roll back.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from engine.core.errors import SeqnoRangeError
from engine.protocol.barrier import BarrierTracker
from engine.protocol.bundle import OVERHEAD, bundle_cuts, decode_bundle, is_bundle
from engine.protocol.errors import CloseCode, ErrorCode, ProtocolError
from engine.protocol.flow import FlowControl
from engine.protocol.messages import (
    PROTOCOL_VERSION,
    Ack,
    Barrier,
    BarrierReachedMessage,
    CloseStream,
    Codec,
    CycleComplete,
    Error,
    FailoverLogs,
    Frames,
    Hello,
    PartitionInfo,
    ProtocolLimits,
    SeqnoAck,
    SnapshotMarker,
    SnapshotSource,
    StreamEndMessage,
    StreamEndReason,
    StreamRequest,
    StreamResponse,
    StreamStatus,
    decode_client_message,
)
from engine.core.rollback import MustRollBack, StreamPosition, decide
from engine.core.types import PartitionState

__all__ = [
    "REPLICATION_PREFIX",
    "Close",
    "LookupPartitions",
    "LookupStream",
    "Output",
    "ServerSession",
    "SessionState",
    "Stream",
    "TailReading",
    "Visit",
]


#: hello name prefix of a replication connection: only those may send ``seqno_ack``.
REPLICATION_PREFIX = "replication:"


@dataclass(frozen=True, slots=True)
class LookupPartitions:
    """Read ``PartitionInfo`` for these partitions and call ``partitions_info``."""

    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LookupStream:
    """Read this partition's current ``PartitionInfo`` and call ``stream_info``."""

    partition: int


@dataclass(frozen=True, slots=True)
class Close:
    """Close the WebSocket with ``code``; ``reason`` fits the 123-byte close-frame limit."""

    code: CloseCode
    reason: str


Output = Any  # a server message, LookupPartitions, LookupStream or Close


class Visit(NamedTuple):
    """One visit of one stream: snapshot ``partition`` after ``after_seqno``, then ``end_visit``.

    A named tuple, not a frozen dataclass: a pass begins one per due stream per connection, and a
    frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) costs about twice the
    tuple's construction (profile in docs/benchmarks.md, Peers)."""

    partition: int
    token: int
    after_seqno: int


class TailReading(Protocol):
    """What ``ServerSession.take_readings`` reads of a reading (``shared_pass.SharedReading``):
    ``partition`` read after ``after``; ``marker`` ``(start, end, purge_seqno)`` and
    ``last_seqno`` of its one marker and one ``last`` batch (None: no such shape); ``count``
    messages laid out in ``parts``."""

    @property
    def partition(self) -> int: ...
    @property
    def after(self) -> int: ...
    @property
    def marker(self) -> tuple[int, int, int] | None: ...
    @property
    def last_seqno(self) -> int | None: ...
    @property
    def count(self) -> int: ...
    @property
    def parts(self) -> bytes: ...


@dataclass(slots=True)
class Stream:
    """An open stream (read-only for the adapter)."""

    partition: int
    uuid: int  # newest failover entry when the stream opened
    position: int  # last seqno sent (snapshot end once a snapshot is complete)
    snap_start: int
    snap_end: int
    end_seqno: int | None
    expected_state: PartitionState
    purge_seqno: int = 0
    dirty: bool = True  # never visited, or notified since the last visit began
    visiting: int | None = None  # token of the visit in progress
    in_snapshot: bool = False
    visits: int = 0
    #: the highest visible ceiling reported (None: not capped, or no visit reported one yet)
    ceiling: int | None = None
    #: visits that held items back: (barrier token, reading end), completed once position >= end
    held: tuple[tuple[int, int], ...] = ()
    #: the reading end of the last visit that held items back: no new visit before the ceiling
    #: reaches it (an earlier one would read and hold back the same parts again)
    wake_at: int = 0


class SessionState(enum.Enum):
    EXPECT_HELLO = "expect_hello"
    STREAMING = "streaming"
    CLOSED = "closed"


_ALLOWED: dict[SessionState, tuple[type, ...]] = {
    SessionState.EXPECT_HELLO: (Hello,),
    SessionState.STREAMING: (StreamRequest, CloseStream, Barrier, Ack, SeqnoAck),
    SessionState.CLOSED: (),
}


class ServerSession:
    """Protocol state of one stream connection (see the module docstring for the API)."""

    def __init__(self, *, node_id: str, partition_count: int, limits: ProtocolLimits | None = None,
                 may_replicate: bool = True) -> None:
        self.node_id = node_id
        #: whether this caller may open a replication connection: its ``seqno_ack``s count toward
        #: majority durability, so only a peer node (the admin role) may speak for a copy
        self.may_replicate = may_replicate
        self.partition_count = partition_count
        self.limits = limits or ProtocolLimits()
        self.state = SessionState.EXPECT_HELLO
        self.hello: Hello | None = None
        self.requested: frozenset[int] = frozenset()
        self.flow: FlowControl | None = None
        self.streams: dict[int, Stream] = {}
        self.positions: dict[int, int] = {}  # every partition streamed on this connection, open or ended
        self.cycle = 0
        self.counters: dict[str, int] = {}
        self.close: Close | None = None
        #: latest ``seqno_ack`` per partition (replication connections): the adapter reads it
        self.replica_acks: dict[int, SeqnoAck] = {}
        self._pending_requests: dict[int, StreamRequest] = {}
        self._hello_lookup: tuple[int, ...] | None = None
        self._barrier = BarrierTracker(self.limits.max_pending_cookies)
        self._cursor = -1  # highest partition visited in the current pass
        #: the streams that may be due (every due stream is here; see ``_due_now``).  WHY: the
        #: loop asks "what is due" several times per pass; scanning every open stream each time
        #: was most of a one-partition tail pass with 64 streams (bench/bench_passes.py)
        self._candidates: set[int] = set()
        self._visits: dict[int, int] = {}  # token -> partition, visits begun and not ended
        self._handlers = {
            Hello: self._on_hello,
            StreamRequest: self._on_stream_request,
            CloseStream: self._on_close_stream,
            Barrier: self._on_barrier,
            Ack: self._on_ack,
            SeqnoAck: self._on_seqno_ack,
        }

    # ================================================================== client input

    def receive_text(self, text: str) -> list[Output]:
        if self.state is SessionState.CLOSED:
            return []
        try:
            msg = decode_client_message(text, max_bytes=self.limits.max_message_bytes)
        except ProtocolError as exc:
            return self._fail(exc)
        return self.receive_message(msg)

    def receive_binary(self, data: bytes) -> list[Output]:
        """A client sends text messages; one that said ``bundle: true`` in hello may also send a
        bundle (``engine.protocol.bundle``) of text messages, taken in order as if each had been
        sent alone.  WHY: a replica acknowledges many partitions at once (``seqno_ack`` per
        partition), and a WebSocket message per ack cost both nodes more than the acks' content."""
        if self.state is SessionState.CLOSED:
            return []
        if self.hello is not None and self.hello.bundle and is_bundle(data):
            try:
                parts = decode_bundle(data)
            except ProtocolError as exc:
                return self._fail(exc)
            outs: list[Output] = []
            for part in parts:
                if type(part) is not str:
                    return outs + self._fail(
                        ProtocolError(
                            ErrorCode.UNSUPPORTED_DATA,
                            "binary part in a client bundle: clients send JSON text messages only",
                            close_code=CloseCode.UNSUPPORTED_DATA,
                        )
                    )
                outs += self.receive_text(part)
                if self.state is SessionState.CLOSED:
                    break
            return outs
        return self._fail(
            ProtocolError(
                ErrorCode.UNSUPPORTED_DATA,
                f"binary frame of {len(data)} bytes: clients send JSON text frames (or, after hello "
                "bundle: true, bundles of them) only",
                close_code=CloseCode.UNSUPPORTED_DATA,
            )
        )

    def receive_message(self, msg: Any) -> list[Output]:
        if self.state is SessionState.CLOSED:
            return []
        if not isinstance(msg, _ALLOWED[self.state]):
            if isinstance(msg, Hello):
                exc = ProtocolError(ErrorCode.DUPLICATE_HELLO, "hello may be sent only once", field="type")
            else:
                exc = ProtocolError(
                    ErrorCode.WRONG_ORDER, f"{type(msg).TYPE} before hello: hello must come first", field="type"
                )
            return self._fail(exc)
        try:
            return self._handlers[type(msg)](msg)
        except ProtocolError as exc:
            return self._fail(exc)

    def _on_hello(self, msg: Hello) -> list[Output]:
        _check_unicode(msg.name, "name")
        if msg.name.startswith(REPLICATION_PREFIX) and not self.may_replicate:
            raise ProtocolError(
                ErrorCode.REPLICATION_FORBIDDEN,
                f"hello name {msg.name!r} opens a replication connection, which needs the admin role "
                "(a cluster node's --cluster-token)",
                field="name",
            )
        if msg.protocol != PROTOCOL_VERSION:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_PROTOCOL,
                f"protocol {msg.protocol} is not supported; this server speaks {PROTOCOL_VERSION}",
                field="protocol",
                close_code=CloseCode.UNSUPPORTED_DATA,
            )
        wanted = msg.partitions if msg.partitions is not None else tuple(range(self.partition_count))
        bad = [p for p in wanted if p >= self.partition_count]
        if bad:
            raise ProtocolError(
                ErrorCode.INVALID_PARTITION,
                f"partition {bad[0]} is out of range 0..{self.partition_count - 1}",
                field="partitions",
                partition=bad[0],
            )
        window = msg.window_bytes if msg.window_bytes is not None else self.limits.default_window_bytes
        if not self.limits.min_window_bytes <= window <= self.limits.max_window_bytes:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"window_bytes {window} is outside {self.limits.min_window_bytes}..{self.limits.max_window_bytes}",
                field="window_bytes",
            )
        if msg.frames is Frames.PACKED and (msg.codec is not Codec.BINARY or not msg.bundle):
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                "frames packed needs codec binary and bundle true (a packed pass is a binary bundle part)",
                field="frames",
            )
        self.hello = msg
        self.requested = frozenset(wanted)
        self.flow = FlowControl(window)
        self.state = SessionState.STREAMING
        self._hello_lookup = tuple(wanted)
        return [LookupPartitions(tuple(wanted))]

    def partitions_info(self, infos: Mapping[int, PartitionInfo]) -> list[Output]:
        """Answer ``LookupPartitions``: emits ``failover_logs``."""
        if self.state is SessionState.CLOSED:
            return []
        if self._hello_lookup is None:
            raise RuntimeError("partitions_info without a pending LookupPartitions")
        wanted, self._hello_lookup = self._hello_lookup, None
        return [FailoverLogs(self.node_id, self.partition_count, {p: infos[p] for p in wanted})]

    def _on_stream_request(self, msg: StreamRequest) -> list[Output]:
        p = msg.partition
        if p >= self.partition_count:
            raise ProtocolError(
                ErrorCode.INVALID_PARTITION,
                f"partition {p} is out of range 0..{self.partition_count - 1}",
                field="partition",
                partition=p,
                close_code=None,
            )
        if p not in self.requested:
            raise ProtocolError(
                ErrorCode.PARTITION_NOT_REQUESTED,
                f"partition {p} was not named in hello",
                field="partition",
                partition=p,
                close_code=None,
            )
        if p in self.streams or p in self._pending_requests:
            raise ProtocolError(
                ErrorCode.DUPLICATE_STREAM,
                f"a stream for partition {p} is already open on this connection",
                field="partition",
                partition=p,
                close_code=None,
            )
        self._pending_requests[p] = msg
        # A pending request already holds barrier cookies back: a cookie sent after the request
        # must cover the stream it opens (or wait until it is refused).
        self._barrier.stream_started(p)
        return [LookupStream(p)]

    def stream_info(self, partition: int, info: PartitionInfo) -> list[Output]:
        """Answer ``LookupStream``: run the rollback decision and open the stream or refuse it."""
        req = self._pending_requests.pop(partition)
        if self.state is SessionState.CLOSED:
            return []
        p = partition
        if info.state != req.expected_state:
            self._count("not_my_partition")
            return [
                StreamResponse(
                    p,
                    StreamStatus.NOT_MY_PARTITION,
                    detail=f"partition {p} is {info.state}, not {req.expected_state}: reload the partition map",
                ),
                *self._stopped(p),
            ]
        end = info.high_seqno if req.to_now else req.end_seqno
        position = StreamPosition(req.uuid, req.start_seqno, req.snap_start, req.snap_end, end, req.strict_uuid)
        try:
            verdict = decide(info.log, info.high_seqno, info.purge_seqno, position)
        except SeqnoRangeError as exc:
            self._count("range_error")
            return [
                StreamResponse(p, StreamStatus.RANGE_ERROR, detail=exc.message, field=exc.field),
                *self._stopped(p),
            ]
        if isinstance(verdict, MustRollBack):
            self._count(f"rollback.{verdict.reason.value}")
            return [
                StreamResponse(
                    p,
                    StreamStatus.ROLLBACK,
                    rollback_seqno=verdict.seqno,
                    reason=verdict.reason,
                    detail=verdict.detail,
                    failover_log=tuple(info.log),
                ),
                *self._stopped(p),
            ]
        self._count("stream_ok")
        stream = Stream(
            partition=p,
            uuid=info.log[0].uuid if info.log else 0,
            position=req.start_seqno,
            snap_start=req.snap_start,
            snap_end=req.snap_end,
            end_seqno=end,
            expected_state=req.expected_state,
            purge_seqno=info.purge_seqno,
        )
        self.streams[p] = stream
        self.positions[p] = stream.position
        self._candidates.add(p)
        out: list[Output] = [
            StreamResponse(p, StreamStatus.OK, detail=verdict.detail, failover_log=tuple(info.log), end_seqno=end)
        ]
        if end is not None and stream.position >= end:
            out += self.end_stream(p, StreamEndReason.END_SEQNO_REACHED)
        return out

    def _on_close_stream(self, msg: CloseStream) -> list[Output]:
        if msg.partition not in self.streams:
            raise ProtocolError(
                ErrorCode.STREAM_NOT_OPEN,
                f"no open stream for partition {msg.partition}",
                field="partition",
                partition=msg.partition,
                close_code=None,
            )
        return self.end_stream(msg.partition, StreamEndReason.CLOSED)

    def _on_barrier(self, msg: Barrier) -> list[Output]:
        _check_unicode(msg.cookie, "cookie")
        self._barrier.add(msg.cookie)
        self._candidates.update(self.streams)  # each stream needs a visit begun after the cookie
        return self._release_barriers()

    def _on_ack(self, msg: Ack) -> list[Output]:
        assert self.flow is not None
        self.flow.on_ack(msg.bytes)
        return []

    def _on_seqno_ack(self, msg: SeqnoAck) -> list[Output]:
        """Record what the replica holds; only a replication connection speaks for a copy."""
        assert self.hello is not None
        if not self.hello.name.startswith(REPLICATION_PREFIX):
            raise ProtocolError(
                ErrorCode.NOT_REPLICATION,
                f"seqno_ack is for replication connections (hello name {REPLICATION_PREFIX!r}...)",
                field="type",
                partition=msg.partition,
                close_code=None,
            )
        if msg.partition not in self.positions:
            raise ProtocolError(
                ErrorCode.STREAM_NOT_OPEN,
                f"seqno_ack for partition {msg.partition}, never streamed on this connection",
                field="partition",
                partition=msg.partition,
                close_code=None,
            )
        if msg.persisted > msg.received:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"partition {msg.partition}: persisted seqno {msg.persisted} above received {msg.received}",
                field="persisted",
                partition=msg.partition,
                close_code=None,
            )
        self.replica_acks[msg.partition] = msg
        return []

    # ================================================================== engine facts

    def notify(self, partition: int) -> None:
        """New mutations were queued on ``partition``: its stream is due for a visit."""
        stream = self.streams.get(partition)
        if stream is not None:
            stream.dirty = True
            self._candidates.add(partition)

    def end_stream(self, partition: int, reason: StreamEndReason) -> list[Output]:
        """End an open stream (no-op if it is not open): ``stream_end`` with ``reason``."""
        stream = self.streams.pop(partition, None)
        if stream is None or self.state is SessionState.CLOSED:
            return []
        self._count(f"stream_end.{reason.value}")
        return [StreamEndMessage(partition, reason, stream.position), *self._stopped(partition)]

    def state_changed(self, partition: int, state: str) -> list[Output]:
        """The engine reports ``partition`` in ``state``: a stream opened for another state ends
        now with ``state_changed`` (DCP's StateChanged), even mid-snapshot.  WHY at once: after
        a takeover or demotion this node's copy is no longer the one consumers should follow,
        and the rest of the snapshot or pass would be seconds of it."""
        stream = self.streams.get(partition)
        if stream is None or state == stream.expected_state:
            return []
        return self.end_stream(partition, StreamEndReason.STATE_CHANGED)

    def hello_timeout(self, seconds: float) -> list[Output]:
        """The adapter's hello timer fired: a connection still without hello is closed (an idle
        socket holds a connection slot); later, this is a no-op."""
        if self.state is not SessionState.EXPECT_HELLO:
            return []
        return self._fail(
            ProtocolError(ErrorCode.HELLO_TIMEOUT, f"no hello within {seconds:g} s of connecting", field="type")
        )

    def shutdown(self) -> list[Output]:
        """The server is going away: end every stream, drop pending cookies, close with 1001."""
        if self.state is SessionState.CLOSED:
            return []
        out: list[Output] = []
        for p in sorted(self.streams):
            out.append(StreamEndMessage(p, StreamEndReason.SHUTTING_DOWN, self.streams[p].position))
        self.streams.clear()
        self.close = Close(CloseCode.GOING_AWAY, "server shutting down")
        self.state = SessionState.CLOSED
        out.append(self.close)
        return out

    # ================================================================== the stream loop

    @property
    def can_send(self) -> bool:
        """Flow control: may the server start another frame now?"""
        return self.state is SessionState.STREAMING and self.flow is not None and self.flow.can_send

    def sent(self, nbytes: int) -> None:
        """Count a frame (text or binary) against the window; frames before hello are free."""
        if self.flow is not None:
            self.flow.on_sent(nbytes)

    def _due(self, stream: Stream) -> bool:
        if stream.ceiling is None:  # not capped
            return stream.visiting is None and (stream.dirty or self._barrier.needs_visit(stream.partition))
        if stream.visiting is not None:
            return False
        if stream.dirty and stream.ceiling >= max(stream.position + 1, stream.wake_at):
            return True
        return self._barrier.needs_visit(stream.partition)

    def _due_now(self) -> list[int]:
        """The due streams' partitions (unordered), pruning candidates that cannot be due until
        an input adds them again (not dirty, no cookie waiting on them, or closed)."""
        streams, barrier = self.streams, self._barrier
        due: list[int] = []
        stale: list[int] = []
        for p in self._candidates:
            stream = streams.get(p)
            if stream is None or not (stream.dirty or barrier.needs_visit(p)):
                stale.append(p)
            elif self._due(stream):
                due.append(p)
        self._candidates.difference_update(stale)
        return due

    def next_visit(self) -> int | None:
        """The partition to visit next (id order within a pass), or None: wait for input."""
        if not self.can_send:
            return None
        due = self._due_now()
        if not due:
            return None
        later = [p for p in due if p > self._cursor]
        return min(later) if later else min(due)

    def begin_visits(self, limit: int) -> list[Visit]:
        """Begin up to ``limit`` visits at once: the stream ``next_visit`` names, then the due
        streams after it in id order (what ``next_visit`` would return one call each, without
        an O(streams) scan per visit).  Each visit draws its barrier token now, before its
        snapshot is taken, so an adapter may read and encode them all in one job.  Empty: nothing
        is due or the window is full."""
        return [self.begin_visit(p) for p in self.peek_visits(limit)]

    def peek_visits(self, limit: int) -> list[int]:
        """The partitions ``begin_visits(limit)`` would visit now, in order, beginning none: an
        adapter checks it can carry the pass out at once before the session commits to it."""
        first = self.next_visit()
        if first is None or limit < 1:
            return []
        later = sorted(p for p in self._due_now() if p > first)
        return [first, *later][:limit]

    def begin_visit(self, partition: int) -> Visit:
        """The loop takes ``partition``'s snapshot now; snapshot after ``Visit.after_seqno``."""
        stream = self.streams[partition]
        if stream.visiting is not None:
            raise RuntimeError(f"partition {partition} is already being visited")
        if partition <= self._cursor:  # a new pass starts from the lowest due id
            self._cursor = -1
        self._cursor = partition
        stream.dirty = False
        stream.visiting = self._barrier.begin_visit(partition)
        self._candidates.discard(partition)  # back with the next notify, cookie or held reading
        self._visits[stream.visiting] = partition
        return Visit(partition, stream.visiting, stream.position)

    def take_readings(self, readings: Sequence[TailReading], max_bytes: int) -> list[Output] | None:
        """Begin, carry out and end at once one visit per reading, in order: the partitions
        ``peek_visits`` named, each read from the stream's position as one snapshot marker and
        one ``last`` batch (``TailReading.marker`` set) or as nothing (an idle reading,
        ``count`` 0), whose parts go in bundles of at most ``max_bytes`` (``bundle.bundle_cuts``
        of the readings' ``parts``: the adapter sends them so, the outputs after the last).
        Returns the outputs (``cycle_complete`` when the pass is over); None: not possible,
        nothing changed.

        The bookkeeping is ``begin_visit``, ``marker_sent``, ``items_sent`` and ``end_visit``
        of every visit in that order, without their per-visit objects.  It is refused when a
        barrier cookie is pending (each visit's end may release one, with the positions of that
        moment: the visit-by-visit path keeps that exact), a stream is bounded, capped, held,
        inside a snapshot or being visited, a reading is not at its stream's position or has
        any other shape or is larger than a bundle, or the window does not take it all.  WHY one call: a tailing
        consumer's pass visits every partition a write touched, and the visit-by-visit
        bookkeeping was a fixed share of each visit's cost (``bench.bench_tail_pass``)."""
        if not readings or not self.can_send or self._barrier.pending:
            return None
        flow = self.flow
        assert flow is not None
        streams = self.streams
        sizes: list[int] = []
        for r in readings:
            stream = streams.get(r.partition)
            if (stream is None or stream.visiting is not None or stream.in_snapshot or stream.ceiling is not None
                    or stream.held or stream.end_seqno is not None or r.after != stream.position
                    or (r.count and r.marker is None)):
                return None
            sizes.append(len(r.parts))
        cuts = bundle_cuts(sizes, max_bytes)
        if cuts is None or sum(sizes) + OVERHEAD * len(cuts) > flow.available:
            return None
        barrier, candidates, positions = self._barrier, self._candidates, self.positions
        for r in readings:
            p = r.partition
            stream = streams[p]
            stream.dirty = False
            token = barrier.begin_visit(p)
            candidates.discard(p)
            marker = r.marker
            if marker is not None:
                stream.snap_start, snap_end, stream.purge_seqno = marker
                stream.snap_end = snap_end
                last = r.last_seqno
                position = snap_end if last is None or snap_end > last else last
                stream.position = positions[p] = position
            stream.visits += 1
            barrier.end_visit(p, token)
        self._cursor = readings[-1].partition
        return self._maybe_finish_pass()

    def snapshot_marker(
        self, partition: int, start: int, end: int, source: SnapshotSource | str, purge_seqno: int
    ) -> SnapshotMarker:
        """Record that a snapshot part starts; returns the marker to send before its batches."""
        self.marker_sent(partition, start, end, purge_seqno)
        return SnapshotMarker(partition, start, end, SnapshotSource(source), purge_seqno)

    def marker_sent(self, partition: int, start: int, end: int, purge_seqno: int) -> None:
        """``snapshot_marker`` for an adapter that encoded the marker itself (the stream server
        formats marker text off the loop; building the message again cost ~8 % of a fan-out
        pass): the same bookkeeping, no message."""
        stream = self.streams[partition]
        stream.snap_start, stream.snap_end = start, end
        stream.purge_seqno = purge_seqno
        stream.in_snapshot = True

    def items_sent(self, partition: int, last_seqno: int | None, last: bool) -> list[Output]:
        """A batch of ``partition`` was sent (``last``: it completed its snapshot)."""
        stream = self.streams.get(partition)
        if stream is None:  # ended meanwhile (closed by the client, state change)
            return []
        if last_seqno is not None:
            stream.position = last_seqno
        if last:
            stream.position = max(stream.position, stream.snap_end)
            stream.in_snapshot = False
        self.positions[partition] = stream.position
        if last and stream.end_seqno is not None and stream.position >= stream.end_seqno:
            return self.end_stream(partition, StreamEndReason.END_SEQNO_REACHED)
        if stream.held and last:
            return self._complete_held(stream)
        return []

    def visible_ceiling(self, partition: int, seqno: int) -> None:
        """Engine fact for a capped stream: ``partition``'s visible ceiling is now ``seqno``
        (ceilings only grow; a lower report is ignored).  A stream that held items back becomes
        due if the ceiling passed its position."""
        stream = self.streams.get(partition)
        if stream is not None and (stream.ceiling is None or seqno > stream.ceiling):
            stream.ceiling = seqno
            self._candidates.add(partition)

    def end_visit(self, visit: Visit, *, ceiling: int | None = None, held_back_to: int | None = None) -> list[Output]:
        """Everything up to the visit's reading was sent (or it was idle).  A capped visit (see
        Visibility in the module docstring) reports the ``ceiling`` it was cut at and, when it
        held parts back, ``held_back_to``: the end of its reading."""
        out: list[Output] = []
        self._visits.pop(visit.token, None)
        stream = self.streams.get(visit.partition)
        if stream is not None and stream.visiting == visit.token:
            stream.visiting = None
            stream.visits += 1
            if ceiling is not None:
                self.visible_ceiling(visit.partition, ceiling)
            if held_back_to is not None and held_back_to > stream.position:
                stream.dirty = True  # more to send once the ceiling reaches the reading's end
                self._candidates.add(visit.partition)
                stream.wake_at = held_back_to
                stream.held += ((visit.token, held_back_to),)
            else:
                if stream.held:
                    stream.held = ()  # this visit's token is newer than every held one
                self._barrier.end_visit(visit.partition, visit.token)
                out += self._release_barriers()
        out += self._maybe_finish_pass()
        return out

    def _complete_held(self, stream: Stream) -> list[Output]:
        """Held-back visits whose reading end the position has now reached count for cookies."""
        done = [token for token, end in stream.held if end <= stream.position]
        if not done:
            return []
        stream.held = tuple(h for h in stream.held if h[1] > stream.position)
        self._barrier.end_visit(stream.partition, max(done))
        return self._release_barriers()

    # ================================================================== internals

    def _maybe_finish_pass(self) -> list[Output]:
        if self._cursor < 0 or self._visits or self.state is SessionState.CLOSED:
            return []
        cursor = self._cursor
        for p in self._due_now():
            if p > cursor:
                return []
        self._cursor = -1
        self.cycle += 1
        return [CycleComplete(self.cycle)]

    def _stopped(self, partition: int) -> list[Output]:
        """A stream ended or was refused: it no longer holds cookies back or the pass open."""
        self._barrier.stream_stopped(partition)
        return self._release_barriers() + self._maybe_finish_pass()

    def _release_barriers(self) -> list[Output]:
        return [BarrierReachedMessage(cookie, dict(self.positions)) for cookie in self._barrier.release()]

    def _fail(self, exc: ProtocolError) -> list[Output]:
        self._count(f"error.{exc.code}")
        out: list[Output] = [Error(exc.code, exc.message, exc.field, exc.partition)]
        if exc.close_code is not None:
            self.close = Close(exc.close_code, _close_reason(exc))
            self.state = SessionState.CLOSED
            out.append(self.close)
        return out

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    @property
    def pending_cookies(self) -> tuple[str, ...]:
        return self._barrier.pending

    def is_open(self, partition: int) -> bool:
        return partition in self.streams


def _check_unicode(text: str, field: str) -> None:
    """Refuse a string that is not valid Unicode: JSON's ``\\ud800`` escape decodes to a lone
    surrogate, which no UTF-8 encoder accepts, so a name holding one would break every later
    use of it (``GET /streams``, logs, metrics labels) instead of this one message."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ProtocolError(
            ErrorCode.INVALID_FIELD,
            f"{field} holds a lone surrogate (U+{ord(text[exc.start]):04X} at index {exc.start}): "
            "not valid Unicode",
            field=field,
        ) from None


def _close_reason(exc: ProtocolError) -> str:
    text = f"{exc.code}: {exc.field}" if exc.field else exc.code
    return text.encode("utf-8")[:123].decode("utf-8", "ignore")
