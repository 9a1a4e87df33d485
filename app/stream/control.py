"""The control conversation of one connection: hello, stream requests, cookies, acks, closes.

Theory of operation
-------------------
Messages are decoded and validated by ``engine.protocol.messages`` (wrong types, unknown fields
and unknown message types become ``ProtocolError`` naming the field).  This module adds the
rules that need the connection's state and the engine:

    state        hello                 stream_request / close_stream / barrier / ack
    NEW          -> READY (answer      error wrong_order, close 1008
                    failover_logs)
    READY        error duplicate_hello  stream_request: rollback decision (engine.rollback.decide)
                 close 1008             -> stream_response ok (stream opens) / rollback / range_error /
                                        not_my_partition; one request never affects another partition

Engine reads (partition stats) run in executor threads via ``read``.  A ``ProtocolError`` with a
``close_code`` ends the connection (error message, then that close code); one without refuses
just that request and the connection carries on.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidPartition, SeqnoRangeError
from engine.protocol import messages as M
from engine.protocol.errors import CloseCode, ErrorCode, ProtocolError
from engine.rollback import Rollback, StreamPosition, decide
from engine.types import PartitionState

from app.stream.cursor import PartitionCursor

if TYPE_CHECKING:
    from app.stream.connection import StreamConnection, StreamLimits

log = logging.getLogger("upr.stream")

__all__ = ["ControlSession"]


class ControlSession:
    """Per-connection control state; ``receive`` is fed every text message by the reader."""

    def __init__(self, engine: Any, read: Callable[..., Awaitable[Any]], limits: "StreamLimits",
                 encoder_for: Callable[[str], Any]) -> None:
        self.engine = engine
        self._read = read
        self.limits = limits
        self._encoder_for = encoder_for
        self.hello: M.Hello | None = None
        self.partitions: tuple[int, ...] = ()
        self._expected: dict[int, str] = {}

    # ------------------------------------------------------------------ queries used by the connection
    def expected_state(self, partition: int) -> str | None:
        return self._expected.get(partition)

    def error_message(self, failure: ProtocolError) -> str:
        return M.encode(M.Error(code=str(failure.code), message=failure.message[:4096], field=failure.field,
                                partition=failure.partition))

    def cycle_complete_message(self, cycle: int) -> str:
        return M.encode(M.CycleComplete(cycle))

    def barrier_message(self, cookie: str, seqnos: dict[int, int]) -> str:
        return M.encode(M.BarrierReached(cookie, seqnos))

    # ------------------------------------------------------------------ input
    async def receive(self, conn: "StreamConnection", text: str) -> None:
        msg = M.decode_client_message(text, max_bytes=self.limits.max_message_bytes)
        if isinstance(msg, M.Hello):
            await self._on_hello(conn, msg)
            return
        if self.hello is None:
            raise ProtocolError(ErrorCode.WRONG_ORDER, f"{type(msg).TYPE} before hello: send hello first",
                                field="type")
        if isinstance(msg, M.StreamRequest):
            await self._on_stream_request(conn, msg)
        elif isinstance(msg, M.Ack):
            conn.ack(msg.bytes)
        elif isinstance(msg, M.Barrier):
            conn.add_barrier(msg.cookie)
        elif isinstance(msg, M.CloseStream):
            cursor = await conn.close_stream(msg.partition)
            if cursor is None:
                raise ProtocolError(ErrorCode.STREAM_NOT_OPEN, f"no stream is open for partition {msg.partition}",
                                    field="partition", partition=msg.partition, close_code=None)
            self._expected.pop(msg.partition, None)
            conn.reply(self._encoder().stream_end(msg.partition, "closed", cursor.last_seqno))

    def _encoder(self) -> Any:
        assert self.hello is not None
        return self._encoder_for(self.hello.codec.value)

    async def _on_hello(self, conn: "StreamConnection", hello: M.Hello) -> None:
        if self.hello is not None:
            raise ProtocolError(ErrorCode.DUPLICATE_HELLO, "hello was already sent on this connection", field="type")
        if hello.protocol != M.PROTOCOL_VERSION:
            raise ProtocolError(ErrorCode.UNSUPPORTED_PROTOCOL,
                                f"protocol {hello.protocol} is not supported; this server speaks {M.PROTOCOL_VERSION}",
                                field="protocol", close_code=CloseCode.UNSUPPORTED_DATA)
        count = self.engine.num_partitions
        if hello.partitions is not None:
            for p in hello.partitions:
                if p >= count:
                    raise ProtocolError(ErrorCode.INVALID_PARTITION,
                                        f"partition {p} is outside 0..{count - 1}", field="partitions", partition=p)
        wanted = hello.partitions if hello.partitions is not None else tuple(range(count))
        window = hello.window_bytes or self.limits.default_window_bytes
        if not self.limits.min_window_bytes <= window <= self.limits.max_window_bytes:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD,
                f"window_bytes {window} is outside {self.limits.min_window_bytes}..{self.limits.max_window_bytes}",
                field="window_bytes")
        self.hello = hello
        self.partitions = wanted
        conn.name = hello.name
        conn.codec = hello.codec.value
        conn.set_window(window)
        conn.encoder = self._encoder()
        stats = await self._read(lambda: [self.engine.stats(p) for p in wanted])
        infos = {
            s.partition: M.PartitionInfo(state=s.state.value, high_seqno=s.high_seqno, purge_seqno=s.purge_seqno,
                                         log=tuple(s.failover_log))
            for s in stats
        }
        conn.reply(M.encode(M.FailoverLogs(node_id=self.engine.node_id, partition_count=count, partitions=infos)))
        log.info("stream %s (%s): hello, %d partitions, codec %s, window %d",
                 hello.name, conn.remote, len(wanted), hello.codec.value, window)

    async def _on_stream_request(self, conn: "StreamConnection", req: M.StreamRequest) -> None:
        p = req.partition
        if p >= self.engine.num_partitions:
            raise ProtocolError(ErrorCode.INVALID_PARTITION,
                                f"partition {p} is outside 0..{self.engine.num_partitions - 1}",
                                field="partition", partition=p)
        if p not in self.partitions:
            raise ProtocolError(ErrorCode.PARTITION_NOT_REQUESTED,
                                f"partition {p} was not named in hello.partitions", field="partition", partition=p)
        if p in conn.cursors:
            raise ProtocolError(ErrorCode.DUPLICATE_STREAM, f"a stream is already open for partition {p}",
                                field="partition", partition=p, close_code=None)
        verdict = await self._read(evaluate, self.engine, p, req)
        conn.reply(M.encode(verdict.response))
        if verdict.response.status is M.StreamStatus.ROLLBACK:
            conn.rollback_issued(str(verdict.response.reason))
            log.warning("stream %s: partition %d told to roll back to %s (%s): %s", conn.name, p,
                     verdict.response.rollback_seqno, verdict.response.reason, verdict.response.detail)
        if verdict.response.status is not M.StreamStatus.OK:
            return
        self._expected[p] = req.expected_state
        conn.open_stream(PartitionCursor(
            p, req.start_seqno, req.snap_start, req.snap_end, verdict.response.end_seqno,
            frame_bytes=self.limits.frame_bytes, frame_items=self.limits.frame_items,
        ))


class Verdict:
    __slots__ = ("response", "rule", "high_seqno", "purge_seqno", "state", "uuid")

    def __init__(self, response: M.StreamResponse, rule: str, high_seqno: int, purge_seqno: int, state: str,
                 uuid: int) -> None:
        self.response = response
        self.rule = rule
        self.high_seqno = high_seqno
        self.purge_seqno = purge_seqno
        self.state = state
        self.uuid = uuid


def evaluate(engine: Any, partition: int, req: M.StreamRequest) -> Verdict:
    """What a stream request gets right now (executor side; shared with ``POST /positions/check``).

    ``rule`` names what decided it: a rollback reason, an ok rule (``from_zero``,
    ``same_history``), ``not_my_partition`` or ``range_error``."""
    try:
        stats = engine.stats(partition)
    except InvalidPartition as exc:
        raise ProtocolError(ErrorCode.INVALID_PARTITION, exc.message, field="partition", partition=partition) from None
    state = stats.state.value
    log_ = tuple(stats.failover_log)
    uuid = log_[0].uuid if log_ else 0
    if state != req.expected_state or stats.state is PartitionState.DEAD:
        detail = f"partition {partition} is {state}, the request expected {req.expected_state}; reload the partition map"
        return Verdict(M.StreamResponse(partition, M.StreamStatus.NOT_MY_PARTITION, detail=detail),
                       "not_my_partition", stats.high_seqno, stats.purge_seqno, state, uuid)
    position = StreamPosition(uuid=req.uuid, start_seqno=req.start_seqno, snap_start=req.snap_start,
                              snap_end=req.snap_end, end_seqno=req.end_seqno, strict_uuid=req.strict_uuid)
    try:
        result = decide(log_, stats.high_seqno, stats.purge_seqno, position)
    except SeqnoRangeError as exc:
        return Verdict(M.StreamResponse(partition, M.StreamStatus.RANGE_ERROR, detail=exc.message, field=exc.field),
                       "range_error", stats.high_seqno, stats.purge_seqno, state, uuid)
    if isinstance(result, Rollback):
        return Verdict(
            M.StreamResponse(partition, M.StreamStatus.ROLLBACK, rollback_seqno=result.seqno,
                             reason=result.reason.value, detail=result.detail, failover_log=log_),
            result.reason.value, stats.high_seqno, stats.purge_seqno, state, uuid)
    end = stats.high_seqno if req.to_now else req.end_seqno
    return Verdict(
        M.StreamResponse(partition, M.StreamStatus.OK, detail=result.detail, failover_log=log_, end_seqno=end),
        result.rule.value, stats.high_seqno, stats.purge_seqno, state, uuid)
