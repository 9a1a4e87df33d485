"""How one snapshot reading is sent: which of its parts open a snapshot, and which batch is last.

A reading is what the stream's cursor takes from the engine for one visit: a ``PartitionSnapshot``
of up to two parts (disk, memory).  The cursor follows the plan and only turns parts into markers
and encoded batches; the rule itself (fresh reading vs continuation after a dropped cursor) lives
here, pure and table-tested (``tests/protocol/test_session.py``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PartPlan", "plan_reading"]


@dataclass(frozen=True, slots=True)
class PartPlan:
    """How one part of a snapshot reading is sent: the marker that opens it (None: it goes on
    under the marker of an earlier part) and whether its final batch is flagged ``last``."""

    marker: tuple[int, int] | None
    last: bool


def plan_reading(parts: Sequence[tuple[int, int]], continue_after: int | None) -> list[PartPlan]:
    """The snapshot markers of one reading, given its parts' ``(start, end)`` in seqno order.

    A fresh reading sends each part as its own snapshot (disk and memory parts apart, as DCP
    sends disk and memory snapshots).  A re-read after a dropped cursor left a snapshot open
    (``continue_after``: the last item already sent or encoded) sends every part as ONE
    continuation snapshot, from ``continue_after + 1`` to the end of the last part, with only
    the final batch ``last``: a consumer's open snapshot may only grow, and a ``last`` in between
    would tell it that it holds a consistent state it does not have yet.  Pure, so the encoder
    threads may call it."""
    if continue_after is None:
        return [PartPlan((start, end), True) for start, end in parts]
    n = len(parts)
    return [PartPlan((continue_after + 1, parts[-1][1]) if i == 0 else None, i == n - 1) for i in range(n)]
