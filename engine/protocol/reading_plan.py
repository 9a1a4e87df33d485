"""How one snapshot reading is sent: which of its parts open a snapshot, which batch is last, and
which parts a consumer may not see yet.

A reading is what the stream's cursor takes from the engine for one visit: a ``PartitionSnapshot``
of up to two parts (disk, memory).  The cursor follows the plan and only turns parts into markers
and encoded batches; the rules themselves (fresh reading vs continuation after a dropped cursor,
the visible ceiling of a ``persisted`` or ``majority`` consumer) live here, pure and table-tested
(``tests/protocol/test_session.py``, ``tests/protocol/test_visibility.py``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PartPlan", "plan_reading", "visible_parts"]


@dataclass(frozen=True, slots=True)
class PartPlan:
    """How one part of a snapshot reading is sent: the marker that opens it (None: it goes on
    under the marker of an earlier part) and whether its final batch is flagged ``last``."""

    marker: tuple[int, int] | None
    last: bool


def visible_parts(parts: Sequence[tuple[int, int]], ceiling: int | None, open_end: int | None = None) -> int:
    """How many leading parts of a reading a consumer capped at ``ceiling`` may receive now.

    A part goes only whole: each part is deduplicated (a key at most once, its latest version in
    the part's range), so cutting it at the ceiling would drop the version of a key that was
    rewritten above the ceiling, and the consumer would hold, as "complete up to the ceiling",
    a state that never existed (and that a failover back to the ceiling could never repair: the
    missing version sits below the consumer's position).  So the parts whose end is at or below
    the ceiling go, and the first part above it and every later one are held back (sent on
    a later visit, once the ceiling has passed them).  ``open_end``: the end of a snapshot left
    open by a dropped cursor; a continuation may only extend it, so unless the visible parts
    reach it, none goes.  ``ceiling`` None: no cap (``memory``)."""
    if ceiling is None:
        return len(parts)
    n = 0
    while n < len(parts) and parts[n][1] <= ceiling:
        n += 1
    if n and open_end is not None and parts[n - 1][1] < open_end:
        return 0
    return n


def plan_reading(parts: Sequence[tuple[int, int]], continue_after: int | None) -> list[PartPlan]:
    """The snapshot markers of one reading, given its parts' ``(start, end)`` in seqno order.

    A fresh reading sends each part as its own snapshot (disk and memory parts apart, as DCP
    sends disk and memory snapshots).  A re-read after a dropped cursor left a snapshot open
    (``continue_after``: the last item already sent or encoded) sends every part as ONE
    continuation snapshot, from ``continue_after + 1`` to the end of the last part, with only
    the final batch ``last``: a consumer's open snapshot may only grow, and a ``last`` in between
    would tell it that it holds a consistent state it does not have yet.  A capped consumer's
    reading is first cut to its ``visible_parts``; the plan covers those.  Pure, so the encoder
    threads may call it."""
    if continue_after is None:
        return [PartPlan((start, end), True) for start, end in parts]
    n = len(parts)
    return [PartPlan((continue_after + 1, parts[-1][1]) if i == 0 else None, i == n - 1) for i in range(n)]
