"""When a partition's failover log gets a new entry: one policy for every place that asks.

An entry ``(new uuid, S)`` says "from seqno ``S`` on, this partition's history is a new branch".
A consumer holding the old uuid past ``S`` is then rolled back (``engine.core.rollback``), so an
entry must be added exactly when the items after ``S`` may differ from what was streamed:

==============================================  ================  ===================================
event                                           new branch at     why
==============================================  ================  ===================================
data dir created                                0                 every partition has a branch
open after an unclean stop (no clean marker)    persisted seqno   items that were only in memory are
of a partition that is not a replica                              gone; their seqnos will be reused
                                                                  by different items
open of a replica, clean or not                 none              a replica's history is its
                                                                  active's: what it lost in memory
                                                                  it streams again from where its
                                                                  persisted snapshot range says (an
                                                                  empty log: it holds nothing yet)
open of another partition with an empty log     persisted seqno   a partition always has a branch
(every entry erased by ``failover.sanitise``)
state becomes active from another state         high seqno        a partition made active by hand
(``set_state``)                                                   may hold a history the old active
                                                                  never had
failover promotion of a replica (``Promoted``)  last complete     the old active may have written
                                                snapshot end      past what this copy holds whole;
                                                                  a partial snapshot is not a state
                                                                  that ever existed (dcp.md §1)
takeover activation (``TakenOver``)             none              the old active handed its whole
                                                                  history over before stopping
clean open, demotion, a state set to itself     none              history continues
==============================================  ================  ===================================

The store's open and the engine's ``set_state``, ``promote`` and ``take_over`` feed events here and write back the log they
get; neither decides by itself.  Pure standard library, table-tested in
tests/engine/test_failover_policy.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.core import failover
from engine.core.failover import FailoverLog
from engine.core.types import FailoverEntry, PartitionState


@dataclass(frozen=True, slots=True)
class Opened:
    """The store opened a partition: ``created`` with the data dir, ``clean`` when the previous
    stop left the clean marker, ``persisted_seqno`` the last seqno on disk."""

    created: bool
    clean: bool
    persisted_seqno: int
    replica: bool = False


@dataclass(frozen=True, slots=True)
class StateChanged:
    """A partition's state is set from ``old`` to ``new`` while its high seqno is ``high_seqno``."""

    old: PartitionState
    new: PartitionState
    high_seqno: int


@dataclass(frozen=True, slots=True)
class Promoted:
    """A replica becomes active by failover (its active is gone) holding every snapshot up to
    ``last_complete_seqno`` whole."""

    last_complete_seqno: int


@dataclass(frozen=True, slots=True)
class TakenOver:
    """A replica becomes active by a handover: the old active streamed it everything, then stopped."""


Event = Opened | StateChanged | Promoted | TakenOver


def new_branch_at(log: FailoverLog, event: Event) -> int | None:
    """The seqno a new history branch starts at after ``event``, or None when history continues."""
    if isinstance(event, Opened):
        if event.created:
            return 0
        if event.replica:
            return None
        if not event.clean or not log:
            return event.persisted_seqno
        return None
    if isinstance(event, Promoted):
        return event.last_complete_seqno
    if isinstance(event, TakenOver):
        return None
    if event.new is PartitionState.ACTIVE and event.old is not PartitionState.ACTIVE:
        return event.high_seqno
    return None


def apply(log: FailoverLog, event: Event, cap: int) -> FailoverLog:
    """``log`` after ``event``: with a new entry (fresh uuid) when ``new_branch_at`` says so,
    else ``log`` itself (the same object, so a caller can tell nothing changed)."""
    seqno = new_branch_at(log, event)
    if seqno is None:
        return log
    return failover.add_entry(log, FailoverEntry(failover.new_uuid(log), seqno), cap)
