"""The client side of the stream protocol as a pure state machine (sans-I/O).

``ClientSession`` decides *what* to ask and *what* a server answer means; an I/O adapter (the
consumer in ``clients``, the Spark task, a replica stream inside the server) owns the WebSocket, the
HTTP calls and the event loop, feeds this class decoded server messages and carries out the actions
it returns (``engine.protocol.client.actions``).  Nothing here awaits, reads a socket, a file or a
clock, so every rule is tested with tables (tests/client/test_session*.py,
tests/protocol/test_client_session_receive.py).

Adapter API::

    session = ClientSession(partitions=..., start=..., saved=..., ring=RingModel(...), ...)
    hello = session.hello(name, codec)                    # send it, then:
    actions = session.receive_handshake(first_message)    # failover_logs: Send(request)..., Repair(...)
    actions = session.receive(message)                    # every later server message, in order
    # after the application processed what a message delivered:
    ack = session.processed(nbytes)                       # an Ack to send, or None
    position.items(first, last); session.snapshot_done(p) # items of a batch; its snapshot end
    request = session.finish_rollback(plan, corrected)    # after a Repair was carried out
    session.connection_lost()                             # then reconnect and hello again

Theory of operation
-------------------
* **Handshake** (``handshake``): the server's failover logs arrive.  On the first handshake the start
  position of every partition is resolved once: explicit ``offsets`` win, then saved state (mode
  ``saved``), else the beginning; mode ``now`` starts at the partition's current high seqno.  The
  ring learns its floor for partitions it never saw (see ``engine.protocol.client.ring``).  ``until_now`` freezes each
  partition's end at the high seqno of that first handshake, so a reconnect does not move the goal,
  with one exception (java-dcp-client's ``StreamTo.NOW``: "up to what existed"): if a later handshake
  shows that the partition's history branched (a new newest failover uuid: unclean restart,
  failover) and its high seqno is now below the end, the end is lowered to that high seqno, since
  the items between may never be written again and the stream would wait for them forever
  (``lowered_ends`` keeps the original end; ``StreamEnd.lowered_from`` shows it).
  Later handshakes (reconnects) keep the positions, which only ever moved on *processed* items.
* **Stream responses**: ``ok`` adopts the failover log; ``rollback`` becomes a ``RollbackPlan`` (keys to
  re-read, or a partition reset when the ring does not reach down to the rollback seqno; never
  fatal, dcp.md §3.10; with ``on_rollback="report"`` only the rollback point, no keys and never a
  reset: the caller decides; with ``"reset"`` always a reset); ``not_my_partition`` asks for a new
  handshake, and after ``MAX_NOT_MY_PARTITION`` in a row gives the partition up; ``range_error`` is
  fatal for that stream (a corrupt or foreign position must not be silently replaced).
* **Following the partition map** (``follow_map``, a cluster consumer's session per node
  connection): ``not_my_partition`` and a ``state_changed`` stream end return ``Moved`` instead of
  asking for a reconnect here; the adapter takes the partition out (``release``, its checkpoint)
  and resumes it on its new node from that checkpoint (``engine.protocol.client.routing``).
* **Validation**: a snapshot marker, item batch or stream end for a partition without an open
  stream, a stream response for a partition never requested, or a message that only belongs to
  the handshake is a ``ProtocolViolation``; an ``error`` message is a ``ServerError``.
* **Flow control**: one ack policy for every adapter (``acks``, ``engine.protocol.client.acks``):
  bytes count once *processed*, and an ``ack`` goes out per fifth of the window.
* **Repairs**: at every handshake, keys the ring holds above a partition's position were applied
  but are not covered by it (the consumer died between applying and saving; a rollback correction
  was newer than the rollback seqno); they are corrected from the server's current documents before
  the partition streams (``repairs``, ``finish_repair``), because no server rollback would name them
  if the server lost them.
* **Seeks** (``seek``; java-dcp-client's ``rollbackAndRestartStream``): the caller names the position a
  partition restarts from.  It is applied when the partition is next requested (after the rollback
  being handled, at the next handshake, or at once for a finished partition); a partition whose
  stream is open needs a new stream, which the consumer gets by reconnecting.
* **Stream ends**: ``end_seqno_reached``/``closed`` finish the partition; ``too_slow`` re-requests it
  from the processed position; ``state_changed``/``shutting_down`` ask for a reconnect.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.core.types import FailoverEntry
from engine.protocol import messages as M
from engine.protocol.errors import ErrorCode
from engine.protocol.frames import ItemBatch
from engine.protocol.messages import PartitionInfo, StreamRequest

from .acks import AckTracker
from .actions import (
    UNSAVED_PROGRESS,
    Action,
    Deliver,
    EndAction,
    Moved,
    Reconnect,
    Repair,
    RollbackPlan,
    RollbackPolicy,
    SeekAction,
    Send,
    StartMode,
    StreamEnded,
)
from .checkpoint import ConsumerState, PartitionCheckpoint
from .errors import ProtocolViolation, ServerError, StreamRejected, UsageError
from .offset import StreamOffset
from .position import PartitionPosition
from .ring import RingModel
from .routing import revision_in

__all__ = ["ClientSession", "StartMode", "RollbackPolicy", "RollbackPlan", "EndAction", "SeekAction",
           "UNSAVED_PROGRESS", "DEFAULT_WINDOW", "MAX_NOT_MY_PARTITION"]

DEFAULT_WINDOW = 8 << 20


_FINISHED_REASONS = {M.StreamEndReason.END_SEQNO_REACHED, M.StreamEndReason.CLOSED}
_REREQUEST_REASONS = {M.StreamEndReason.TOO_SLOW}
#: ``error`` codes answering hello that mean "the arguments were wrong", not "the server failed".
_CALLER_MISTAKES = {ErrorCode.INVALID_PARTITION, ErrorCode.INVALID_FIELD}
#: A partition refused as "not my partition" this many times in a row is given up (StreamRejected).
MAX_NOT_MY_PARTITION = 5


class ClientSession:
    def __init__(
        self,
        *,
        partitions: Sequence[int] | None = None,
        start: StartMode | str = StartMode.SAVED,
        saved: ConsumerState | None = None,
        offsets: Mapping[int, StreamOffset] | None = None,
        end_seqnos: Mapping[int, int] | None = None,
        until_now: bool = False,
        ring: RingModel | None = None,
        max_corrections: int = 10_000,
        on_rollback: RollbackPolicy | str = RollbackPolicy.REPAIR,
        window_bytes: int = DEFAULT_WINDOW,
        ack_ratio: float = 0.2,
        follow_map: bool = False,
    ) -> None:
        self.start = StartMode(start)
        #: a partition that is not active on this node moves (``Moved``) instead of reconnecting here
        self.follow_map = follow_map
        try:
            self.on_rollback = RollbackPolicy(on_rollback)
        except ValueError:
            raise UsageError(f"on_rollback must be 'repair', 'report' or 'reset', got {on_rollback!r}",
                             field="on_rollback") from None
        self.window_bytes = window_bytes
        self.acks = AckTracker(window_bytes, ack_ratio)
        self._not_mine: dict[int, int] = {}
        #: A rollback needing more corrections than this resets the partition instead: re-reading
        #: every key one GET at a time costs more than streaming the partition again.
        self.max_corrections = max_corrections
        self.requested_partitions = list(partitions) if partitions is not None else None
        self.saved = saved
        self.offsets = dict(offsets or {})
        self.end_seqnos = dict(end_seqnos or {})
        self.until_now = until_now
        self.ring = ring
        self.positions: dict[int, PartitionPosition] = {}
        self.finished: set[int] = set()
        self.open: set[int] = set()
        self.node_id: str | None = None
        self.partition_count: int | None = None
        self.handshakes = 0
        self.rollbacks = 0
        self.resets = 0
        self.rollback_counts: dict[str, int] = {}
        #: until_now partitions whose end was lowered after their history branched: original end.
        self.lowered_ends: dict[int, int] = {}
        #: Caller-chosen restart positions, applied when the partition is next requested.
        self.seeks: dict[int, StreamOffset] = {}
        self._now_ends: set[int] = set()
        self._branches: dict[int, int] = {}
        self._rolling_back: set[int] = set()
        #: Partitions whose ring holds items applied beyond the resume position (see ``handshake``).
        self.repairs: dict[int, RollbackPlan] = {}
        if until_now and end_seqnos:
            raise UsageError("until_now and end_seqnos are exclusive: pick one way to bound the streams")
        for p, end in self.end_seqnos.items():
            off = self.offsets.get(p)
            if off is not None and end < off.seqno:
                raise UsageError(f"partition {p}: end seqno {end} is before the start seqno {off.seqno}",
                                 partition=p, field="end_seqnos")

    # ------------------------------------------------------------------ handshake
    def hello(self, name: str, codec: M.Codec | str = M.Codec.BINARY, *, bundle: bool = False,
              visibility: M.Visibility | str = M.Visibility.MEMORY,
              frames: M.Frames | str = M.Frames.MESSAGES) -> M.Hello:
        """The ``hello`` that opens every connection (the first and each reconnect)."""
        partitions = self.requested_partitions
        return M.Hello(name, tuple(sorted(partitions)) if partitions is not None else None, M.Codec(codec),
                       self.window_bytes, bundle=bundle, visibility=M.Visibility(visibility),
                       frames=M.Frames(frames))

    def receive_handshake(self, msg: Any, nbytes: int = 0) -> list[Action]:
        """The server's answer to ``hello``: the stream requests to send (``Send``), after the
        repairs of unsaved progress (``Repair``) whose partitions stream once they are finished.

        ``nbytes`` is the answer's frame size: it counts as processed (the window starts anew)."""
        if isinstance(msg, M.Error):
            if msg.code in _CALLER_MISTAKES:  # e.g. a partition the server does not have
                raise UsageError(f"server refused hello: {msg.code}: {msg.message}", field=msg.field,
                                 partition=msg.partition)
            raise ServerError(f"server refused hello: {msg.code}: {msg.message}", server_code=msg.code,
                              field=msg.field)
        if not isinstance(msg, M.FailoverLogs):
            raise ProtocolViolation(f"expected failover_logs after hello, got {type(msg).__name__}")
        self.acks.reset()
        self.acks.processed(nbytes)
        requests = self.handshake(msg.node_id, msg.partition_count, msg.partitions)
        actions: list[Action] = [Repair(plan, unsaved=True) for plan in self.repairs.values()]
        actions += [Send(request) for request in requests]
        return actions

    def handshake(self, node_id: str | None, partition_count: int,
                  infos: Mapping[int, PartitionInfo]) -> list[StreamRequest]:
        """The server's failover logs arrived: return the stream requests to send, in partition order."""
        first = self.handshakes == 0
        self.handshakes += 1
        self.node_id, self.partition_count = node_id, partition_count
        wanted = self.requested_partitions if self.requested_partitions is not None else range(partition_count)
        for p in wanted:
            if not 0 <= p < partition_count:
                raise UsageError(f"partition {p} out of range: the server has {partition_count}", partition=p,
                                 field="partitions")
        if first:
            for p in wanted:
                info = infos.get(p)
                if info is None:
                    raise StreamRejected(f"server sent no failover log for partition {p}", status="missing",
                                         partition=p)
                self.positions[p] = self._initial_position(p, info)
                if self.until_now and p not in self.end_seqnos:
                    self.end_seqnos[p] = info.high_seqno
                    self._now_ends.add(p)
                    self._branches[p] = _branch(info)
        # goals carried from another connection (``adopt_goals``) meet this node's history now;
        # the ones just measured here are on the branch they were measured on (a no-op for them)
        self._lower_ends(infos)
        self.open.clear()
        self._rolling_back.clear()  # a rollback cut short by the lost connection is answered again
        for p in sorted(self.seeks):  # before the repairs: the caller's position replaces the old one
            self._apply_seek(p, self.seeks.pop(p))
        self.repairs = self._repair_plans()
        return [self.request_for(p) for p in sorted(self.positions) if p not in self.finished and p not in self.repairs]

    def goals(self, partitions: Iterable[int]) -> dict[int, tuple[int, int, int | None]]:
        """The "until now" ends of ``partitions`` that a branched history may still lower: (end, the
        branch uuid it was measured on, the original end if it was lowered already).  A cluster
        consumer carries them to the connection that streams a moved partition next
        (``adopt_goals``), so a failover that lost the last items lowers the goal there too."""
        return {p: (self.end_seqnos[p], self._branches[p], self.lowered_ends.get(p))
                for p in partitions if p in self._now_ends}

    def adopt_goals(self, goals: Mapping[int, tuple[int, int, int | None]]) -> None:
        """Take over ``goals`` (``goals()`` of an earlier connection) before the first handshake."""
        for p, (end, branch, lowered_from) in goals.items():
            self.end_seqnos[p] = end
            self._now_ends.add(p)
            self._branches[p] = branch
            if lowered_from is not None:
                self.lowered_ends[p] = lowered_from

    def _lower_ends(self, infos: Mapping[int, PartitionInfo]) -> None:
        """Reconnect (or a goal carried from another node): an until_now end above the high seqno
        of a new branch can never be reached by the history that exists; lower it to that high
        seqno (see the module docstring)."""
        for p in sorted(self._now_ends - self.finished):
            info = infos.get(p)
            if info is None:
                continue
            branch = _branch(info)
            if branch != self._branches[p] and info.high_seqno < self.end_seqnos[p]:
                self.lowered_ends.setdefault(p, self.end_seqnos[p])
                self.end_seqnos[p] = info.high_seqno
            self._branches[p] = branch

    def _repair_plans(self) -> dict[int, RollbackPlan]:
        """Keys the ring holds above a partition's position were applied but are not covered by it:
        the consumer died between applying and saving, or a rollback correction brought a version
        newer than the rollback seqno.  If the server loses those versions, no rollback answer will
        ever name them (a request from below the branch point is fine by DCP's rules) and the
        application would keep phantoms; so at every handshake they are re-read and handed over as
        corrections before their partition streams, like a rollback to the position, except that
        the position (possibly a partial snapshot) stays as it is."""
        ring = self.ring
        if ring is None:
            return {}
        at = {p: pos.seqno for p, pos in self.positions.items() if p not in self.finished}
        plans = {}
        for p, keys in sorted(ring.keys_above_many(at).items()):
            seqno = at[p]
            detail = f"{len(keys)} key(s) applied above seqno {seqno}, which the saved position does not cover"
            if ring.covers(p, seqno) and len(keys) <= self.max_corrections:
                plans[p] = RollbackPlan(p, seqno, UNSAVED_PROGRESS, detail, (), tuple(keys), False)
            else:
                why = "the ring lost some of them" if not ring.covers(p, seqno) else "too many to re-read"
                plans[p] = RollbackPlan(p, seqno, UNSAVED_PROGRESS, f"{detail}; {why}", (), (), True)
        return plans

    def finish_repair(self, plan: RollbackPlan, corrected: Sequence[tuple[bytes, int]] = ()) -> StreamRequest:
        """The repair's corrections (or reset) were processed: stream the partition."""
        p = plan.partition
        del self.repairs[p]
        if plan.reset:
            self.resets += 1
            self.positions[p].reset()
            if self.ring is not None:
                self.ring.reset(p)
        elif self.ring is not None:
            self.ring.replace_above(p, plan.seqno, corrected)
        return self.request_for(p)

    def _initial_position(self, p: int, info: PartitionInfo) -> PartitionPosition:
        ring = self.ring
        if p in self.offsets:
            off, log, applied_from = self.offsets[p], (), self.offsets[p].seqno
        elif self.start is StartMode.NOW:
            uuid = info.log[0].uuid if info.log else 0
            off = StreamOffset.at(uuid, info.high_seqno)
            log, applied_from = info.log, 0  # nothing below "now" was applied by this consumer
        elif self.start is StartMode.SAVED and self.saved is not None and p in self.saved.partitions:
            cp = self.saved.partitions[p]
            off, log, applied_from = cp.offset, cp.failover_log, cp.offset.seqno
        else:
            off, log, applied_from = StreamOffset.beginning(), (), 0
        if ring is not None and ring.floor(p) is None:
            ring.set_floor(p, applied_from)
        pos = PartitionPosition(p, off, log)
        if self.saved is not None and p in self.saved.partitions and p not in self.offsets \
                and self.start is StartMode.SAVED:
            pos.last_complete = self.saved.partitions[p].last_complete
        return pos

    def request_for(self, p: int) -> StreamRequest:
        sought = self.seeks.pop(p, None)
        if sought is not None:
            self._apply_seek(p, sought)
        self.open.add(p)
        off = self.positions[p].offset()
        return StreamRequest(p, off.uuid, off.seqno, off.snap_start, off.snap_end, end_seqno=self.end_seqnos.get(p))

    # ------------------------------------------------------------------ seeks
    def seek(self, p: int, offset: StreamOffset) -> SeekAction:
        """Restart partition ``p`` from ``offset`` (the caller's own position, e.g. after it cut its
        copy back on a ``Rollback``): see the module docstring for when it takes effect."""
        if not isinstance(offset, StreamOffset):
            raise UsageError(f"seek needs a StreamOffset, got {type(offset).__name__}", partition=p, field="offset")
        end = self.end_seqnos.get(p)
        if end is not None and offset.seqno > end:
            raise UsageError(f"partition {p}: cannot seek to seqno {offset.seqno}, after the stream's end {end}",
                             partition=p, seqno=offset.seqno, field="offset")
        if not self.positions:  # before the first handshake: a start offset like any other
            if self.requested_partitions is not None and p not in self.requested_partitions:
                raise UsageError(f"partition {p} is not one of the consumer's partitions", partition=p)
            self.offsets[p] = offset
            return SeekAction.LATER
        if p not in self.positions:
            raise UsageError(f"partition {p} is not one of the consumer's partitions", partition=p)
        self.seeks[p] = offset
        if p in self.open:
            return SeekAction.RECONNECT
        if p in self._rolling_back or p in self.repairs:
            return SeekAction.LATER
        was_finished = p in self.finished
        self.finished.discard(p)
        return SeekAction.REQUEST if was_finished else SeekAction.LATER

    def _apply_seek(self, p: int, offset: StreamOffset) -> None:
        old = self.positions[p]
        log = tuple(e for e in old.failover_log if e.seqno <= offset.seqno)
        self.positions[p] = PartitionPosition(p, offset, log)
        ring = self.ring
        if ring is not None:
            # Nothing above the new position is applied any more (the caller says so); forward, the
            # items skipped over were applied by other means, so the ring covers only from there.
            ring.drop_above(p, offset.seqno)
            floor = ring.floor(p)
            if floor is None or floor > offset.seqno or offset.seqno > old.seqno:
                ring.set_floor(p, offset.seqno)

    # ------------------------------------------------------------------ stream responses
    def stream_ok(self, p: int, failover_log: Iterable[FailoverEntry]) -> None:
        self.positions[p].stream_opened(tuple(failover_log))

    def plan_rollback(self, p: int, seqno: int, reason: str | None, detail: str | None,
                      failover_log: Iterable[FailoverEntry]) -> RollbackPlan:
        self.rollbacks += 1
        key = reason or "unspecified"
        self.rollback_counts[key] = self.rollback_counts.get(key, 0) + 1
        log = tuple(failover_log)
        self.open.discard(p)  # a rollback answer opens no stream
        self._rolling_back.add(p)
        kept = [e for e in (log or self.positions[p].failover_log) if e.seqno <= seqno]
        resume = StreamOffset.at(kept[0].uuid, seqno) if kept else StreamOffset.beginning()
        if self.on_rollback is RollbackPolicy.REPORT:
            return RollbackPlan(p, seqno, reason, detail, log, (), False, resume)
        if self.on_rollback is RollbackPolicy.RESET:
            return RollbackPlan(p, seqno, reason, detail, log, (), True, StreamOffset.beginning())
        ring = self.ring
        if ring is not None and ring.covers(p, seqno):
            keys = tuple(ring.keys_above(p, seqno))
            if len(keys) <= self.max_corrections:
                return RollbackPlan(p, seqno, reason, detail, log, keys, False, resume)
        if ring is None and seqno >= self.positions[p].seqno:
            # Nothing applied above the rollback seqno (a consumer with no ring can only know this).
            return RollbackPlan(p, seqno, reason, detail, log, (), False, resume)
        return RollbackPlan(p, seqno, reason, detail, log, (), True, StreamOffset.beginning())

    def finish_rollback(self, plan: RollbackPlan,
                        corrected: Sequence[tuple[bytes, int]] = ()) -> StreamRequest:
        """The corrections (or the reset) were processed: move the position and re-request.

        ``corrected`` lists (key, seqno) of corrections whose current version is above the rollback
        seqno: they stay in the ring, because that version may itself be rolled back later."""
        p = plan.partition
        self._rolling_back.discard(p)
        pos = self.positions[p]
        if plan.reset:
            self.resets += 1
            pos.reset()
            if self.ring is not None:
                self.ring.reset(p)
        else:
            pos.rollback(plan.seqno, plan.failover_log)
            if self.ring is not None:
                self.ring.replace_above(p, plan.seqno, corrected)
        return self.request_for(p)

    def not_my_partition(self, p: int) -> None:
        self.open.discard(p)

    def release(self, p: int) -> PartitionCheckpoint:
        """Take partition ``p`` out of this session (it moved to another node's connection): its
        checkpoint, from which the session that streams it next resumes.  Its stream must not be
        open (it ended, or was refused)."""
        if p in self.open:
            raise UsageError(f"partition {p} still streams on this connection: it cannot move", partition=p)
        pos = self.positions.pop(p)
        self.finished.discard(p)
        self.seeks.pop(p, None)
        self.repairs.pop(p, None)
        self._rolling_back.discard(p)
        self._not_mine.pop(p, None)
        if self.requested_partitions is not None and p in self.requested_partitions:
            self.requested_partitions.remove(p)
        if self.saved is not None and p in self.saved.partitions:
            self.saved = ConsumerState({q: c for q, c in self.saved.partitions.items() if q != p},
                                       self.saved.node_id, self.saved.partition_count)
        return PartitionCheckpoint(pos.offset(), pos.failover_log, pos.last_complete)

    def range_error(self, p: int, detail: str | None) -> None:
        self.open.discard(p)
        off = self.positions[p].offset()
        raise StreamRejected(
            f"partition {p}: the server refused position {off.to_dict()} as out of range"
            + (f" ({detail})" if detail else "")
            + "; the saved state does not belong to this server's history: delete it to start over",
            status=M.StreamStatus.RANGE_ERROR.value, partition=p, seqno=off.seqno)

    # ------------------------------------------------------------------ stream ends, connection
    def stream_end(self, p: int, reason: str, last_seqno: int | None) -> EndAction:
        self.open.discard(p)
        self.positions[p].stream_ended(last_seqno)
        if reason in _FINISHED_REASONS:
            self.finished.add(p)
            return EndAction.FINISHED
        if reason in _REREQUEST_REASONS:
            return EndAction.REREQUEST
        return EndAction.RECONNECT

    @property
    def all_finished(self) -> bool:
        return bool(self.positions) and len(self.finished) == len(self.positions)

    @property
    def bounded(self) -> bool:
        return self.until_now or bool(self.end_seqnos) and set(self.end_seqnos) >= set(self.positions)

    def connection_lost(self) -> None:
        self.acks.reset()  # a new connection starts with an empty window
        self.open.clear()
        self._rolling_back.clear()
        for pos in self.positions.values():
            pos.connection_lost()

    # ------------------------------------------------------------------ receive
    def receive(self, msg: Any) -> list[Action]:
        """One server message after the handshake: what to deliver, send or do, in order."""
        kind = type(msg)
        if kind is ItemBatch:
            self.items_arrived(msg.partition)
            return [Deliver(msg)]
        handler = self._RECEIVERS.get(kind)
        if handler is None:
            raise ProtocolViolation(f"unexpected {kind.__name__} in the middle of a stream")
        return handler(self, msg)

    def items_arrived(self, p: int) -> PartitionPosition:
        """An item batch of partition ``p`` arrived (adapters that decode batches their own way,
        like the Spark task's Arrow path, call this instead of ``receive``): its position, to move
        once the items are processed; ``ProtocolViolation`` if ``p`` has no open stream."""
        return self._open_position(p, "items")

    def section_arrived(self, p: int, marker: tuple[int, int, Any, int] | None) -> PartitionPosition:
        """A packed pass's section of partition ``p`` arrived (``engine.protocol.packed``): its
        marker, if it has one, is received as ``receive`` receives a ``snapshot`` message, then
        its batch as ``items_arrived``; returns the position, to move once the items are
        processed.  WHY apart: a reader that takes the pass whole (a replica) does the session's
        part of both messages without building them."""
        pos = self._open_position(p, "items")
        if marker is not None:
            pos.snapshot_marker(marker[0], marker[1])
        return pos

    def _open_position(self, p: int, what: str) -> PartitionPosition:
        pos = self.positions.get(p)
        if pos is None or p not in self.open:
            raise ProtocolViolation(f"{what} for partition {p}, which has no open stream", partition=p)
        return pos

    def _on_snapshot_marker(self, msg: M.SnapshotMarker) -> list[Action]:
        # the marker is not promoted until an item of it is processed (see PartitionPosition)
        self._open_position(msg.partition, "snapshot").snapshot_marker(msg.start, msg.end)
        return [Deliver(msg)]

    def _on_stream_response(self, msg: M.StreamResponse) -> list[Action]:
        p = msg.partition
        if p not in self.positions:
            raise ProtocolViolation(f"stream_response for unrequested partition {p}", partition=p)
        status = msg.status
        if status is M.StreamStatus.OK:
            self._not_mine.pop(p, None)
            self.stream_ok(p, msg.failover_log or ())
            return []
        if status is M.StreamStatus.ROLLBACK:
            reason = str(msg.reason) if msg.reason is not None else None  # events carry plain text
            return [Repair(self.plan_rollback(p, msg.rollback_seqno or 0, reason, msg.detail,
                                              msg.failover_log or ()))]
        if status is M.StreamStatus.NOT_MY_PARTITION:
            self.not_my_partition(p)
            if self.follow_map:
                return [Moved(p, M.StreamStatus.NOT_MY_PARTITION.value, revision_in(msg.detail), msg.detail or None)]
            count = self._not_mine[p] = self._not_mine.get(p, 0) + 1
            if count >= MAX_NOT_MY_PARTITION:
                raise StreamRejected(f"partition {p} is not served by node {self.node_id} "
                                     f"({msg.detail or 'not active'})", status=M.StreamStatus.NOT_MY_PARTITION.value, partition=p)
            return [Reconnect(f"partition {p}: not my partition; reloading the partition map")]
        self.range_error(p, msg.detail or msg.field)
        return []  # pragma: no cover - range_error raises

    def _on_stream_end(self, msg: M.StreamEndMessage) -> list[Action]:
        p = msg.partition
        if p not in self.positions:
            raise ProtocolViolation(f"stream_end for unknown partition {p}", partition=p)
        reason = str(msg.reason)
        then = self.stream_end(p, reason, msg.last_seqno)
        actions: list[Action] = [StreamEnded(p, reason, msg.last_seqno, self.lowered_ends.get(p), then)]
        if then is EndAction.REREQUEST:
            actions.append(Send(self.request_for(p)))
        elif then is EndAction.RECONNECT:
            if self.follow_map and reason == M.StreamEndReason.STATE_CHANGED.value:
                actions.append(Moved(p, reason))
            else:
                actions.append(Reconnect(f"partition {p} stream ended: {reason}"))
        return actions

    def _on_barrier_reached(self, msg: M.BarrierReachedMessage) -> list[Action]:
        return [Deliver(msg)]

    def _on_cycle_complete(self, msg: M.CycleComplete) -> list[Action]:
        return []

    def _on_error(self, msg: M.Error) -> list[Action]:
        raise ServerError(f"server error {msg.code}: {msg.message}", server_code=msg.code, field=msg.field,
                          partition=msg.partition)

    _RECEIVERS: dict[type, Any] = {
        M.SnapshotMarker: _on_snapshot_marker,
        M.StreamResponse: _on_stream_response,
        M.StreamEndMessage: _on_stream_end,
        M.BarrierReachedMessage: _on_barrier_reached,
        M.CycleComplete: _on_cycle_complete,
        M.Error: _on_error,
    }

    # ------------------------------------------------------------------ processed
    def processed(self, nbytes: int) -> M.Ack | None:
        """``nbytes`` of received frames were processed: the ``ack`` to send now, if one is due."""
        n = self.acks.processed(nbytes)
        return M.Ack(n) if n else None

    def snapshot_done(self, p: int) -> tuple[int, int]:
        """The last item of partition ``p``'s snapshot was processed: the snapshot's (start, end)."""
        pos = self.positions[p]
        pos.snapshot_end()
        return pos.snap_start, pos.snap_end

    # ------------------------------------------------------------------ state
    def state(self, *, whole_snapshots: bool = False) -> ConsumerState:
        """What to save.  ``whole_snapshots``: each partition's last *completely* processed snapshot
        instead of its last processed item, for applications that apply a snapshot atomically at
        its end (so an item counts as applied only then)."""
        if whole_snapshots:
            parts = {p: PartitionCheckpoint(StreamOffset(pos.uuid, pos.last_complete[1], *pos.last_complete),
                                            pos.failover_log, pos.last_complete)
                     for p, pos in self.positions.items()}
        else:
            parts = {p: PartitionCheckpoint(pos.offset(), pos.failover_log, pos.last_complete)
                     for p, pos in self.positions.items()}
        if self.saved is not None:  # keep partitions this consumer did not stream this time
            for p, cp in self.saved.partitions.items():
                parts.setdefault(p, cp)
        return ConsumerState(parts, self.node_id, self.partition_count)

    def committed(self) -> dict[int, StreamOffset]:
        return {p: pos.offset() for p, pos in self.positions.items()}


def _branch(info: PartitionInfo) -> int:
    """The uuid of the partition's newest history branch (0: no failover log)."""
    return info.log[0].uuid if info.log else 0
