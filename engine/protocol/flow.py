"""Connection-level flow control, as DCP does it: a window of unacknowledged bytes.

The consumer names a window in ``hello``; every frame the server sends afterwards (text or
binary, counted by its size in bytes) adds to the bytes in flight, and the consumer's ``ack``
messages subtract what it has processed.  The server starts a frame only while
``in_flight < window``, so one large frame may overshoot the window (items can be up to the value
limit), but the overshoot is bounded by one frame.  Acknowledging more than is in flight means
the consumer's accounting is broken: a protocol error, because the window would otherwise grow
without bound.
"""
from __future__ import annotations

from engine.protocol.errors import ErrorCode, ProtocolError

__all__ = ["FlowControl"]


class FlowControl:
    """Bytes sent minus bytes acknowledged, against a fixed window."""

    __slots__ = ("acked", "sent", "window")

    def __init__(self, window: int) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self.window = window
        self.sent = 0
        self.acked = 0

    @property
    def in_flight(self) -> int:
        return self.sent - self.acked

    @property
    def can_send(self) -> bool:
        """May the server start another frame now?"""
        return self.sent - self.acked < self.window

    @property
    def available(self) -> int:
        """Bytes left in the window (0 when full or overshot)."""
        return max(0, self.window - self.in_flight)

    def on_sent(self, nbytes: int) -> None:
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        self.sent += nbytes

    def on_ack(self, nbytes: int) -> None:
        """Apply a consumer ack; more than is in flight is a protocol error naming ``bytes``."""
        if nbytes < 0 or nbytes > self.in_flight:
            raise ProtocolError(
                ErrorCode.ACK_EXCEEDS_IN_FLIGHT,
                f"ack of {nbytes} bytes but only {self.in_flight} bytes are unacknowledged",
                field="bytes",
            )
        self.acked += nbytes
