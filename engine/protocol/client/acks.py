"""Client side of flow control: acknowledge bytes once processed, in chunks.

The server keeps at most ``window`` unacknowledged bytes in flight.  The client counts the size of
every frame it received after ``hello`` and adds it to ``processed`` only when the handler has
finished with everything the frame carried, so a slow handler slows the server instead of filling
the client's memory (dcp.md §1 flow control; §3.6 on leaked acks that stall streams).  Acks go out
once ``ratio`` of the window is processed (DCP guideline: 20 %), which keeps the ack traffic small
while the server never waits for more than a fifth of its window.  Every counted byte is acked
eventually: ``flush()`` returns the remainder (used when the consumer goes idle).
"""
from __future__ import annotations

__all__ = ["AckTracker"]


class AckTracker:
    __slots__ = ("window", "threshold", "unacked", "acked_total")

    def __init__(self, window: int, ratio: float = 0.2) -> None:
        if window < 1 or not 0 < ratio <= 1:
            raise ValueError("AckTracker needs window >= 1 and 0 < ratio <= 1")
        self.window = window
        self.threshold = max(1, int(window * ratio))
        self.unacked = 0
        self.acked_total = 0

    def processed(self, nbytes: int) -> int:
        """Count processed bytes; returns how many to acknowledge now (0 = not yet)."""
        self.unacked += nbytes
        if self.unacked >= self.threshold:
            return self.flush()
        return 0

    def flush(self) -> int:
        n = self.unacked
        self.unacked = 0
        self.acked_total += n
        return n

    def reset(self) -> None:
        """A new connection starts with an empty window: bytes of the old one are never acked."""
        self.unacked = 0
