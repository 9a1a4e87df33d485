"""What the client protocol session decides, as values: its policies and the actions it returns.

``ClientSession.receive`` returns a list of these, in order, for the I/O adapter to carry out
(the consumer, the Spark task, a replica stream inside the server):

    Send(message)        encode the client message and send it
    Deliver(message)     hand the server message to the application as an event (snapshot marker,
                         item batch, barrier reached); it counts as processed once the
                         application is done with it
    StreamEnded(...)     hand over that a partition's stream ended (``then`` says what follows:
                         finished, re-requested with the ``Send`` after it, or a reconnect)
    Repair(plan)         carry out a ``RollbackPlan`` (re-read its keys as corrections, or reset the
                         partition), then call ``finish_rollback``/``finish_repair``
    Reconnect(reason)    drop the connection and handshake again (after a backoff)

Faults are exceptions from ``engine.protocol.client.errors``, not actions.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Union

from engine.core.types import FailoverEntry

from .offset import StreamOffset

__all__ = [
    "StartMode", "RollbackPolicy", "SeekAction", "EndAction", "RollbackPlan", "UNSAVED_PROGRESS",
    "Send", "Deliver", "StreamEnded", "Repair", "Reconnect", "Moved", "Action",
]


class StartMode(str, enum.Enum):
    BEGINNING = "beginning"
    SAVED = "saved"
    NOW = "now"


class RollbackPolicy(str, enum.Enum):
    """What a server rollback does to the application's data.

    REPAIR  (default) ring-based: the keys applied above the rollback seqno are re-read and handed
            over as corrections, or the partition is reset when the ring does not reach down.
    REPORT  only report the rollback point (a ``Rollback`` event, no corrections, never a reset):
            the caller undoes what it must itself, and may ``seek`` elsewhere; otherwise the
            partition resumes at the rollback seqno.  For consumers that can cut their own copy
            back exactly (backups, logs) and would only be harmed by key-wise corrections.
            Such consumers usually keep no ring (``ring_size=0``); one that does still gets its
            unsaved progress repaired from it at each handshake (``UNSAVED_PROGRESS``).
    RESET   every rollback resets the partition: drop it and stream it again from 0.  For readers
            that cannot re-plan and keep no ring (a Spark task: its driver sees the branch at the
            next planning step).
    """

    REPAIR = "repair"
    REPORT = "report"
    RESET = "reset"


class SeekAction(str, enum.Enum):
    """What the I/O adapter must do for a ``ClientSession.seek``."""

    #: nothing now: the seek applies when the partition is next requested (rollback, handshake)
    LATER = "later"
    #: send ``request_for(partition)`` now (the partition had no stream: finished)
    REQUEST = "request"
    #: the partition is streaming: a new stream is needed, so reconnect
    RECONNECT = "reconnect"


class EndAction(str, enum.Enum):
    FINISHED = "finished"
    REREQUEST = "rerequest"
    RECONNECT = "reconnect"


#: ``Rollback.reason`` of a repair of the consumer's own unsaved progress (not a server rollback).
UNSAVED_PROGRESS = "unsaved_progress"


@dataclass(frozen=True, slots=True)
class RollbackPlan:
    partition: int
    seqno: int
    reason: str | None
    detail: str | None
    failover_log: tuple[FailoverEntry, ...]
    #: Keys applied above ``seqno`` to re-read and hand over as corrections (empty when ``reset``).
    keys: tuple[bytes, ...]
    #: The ring does not cover ``seqno``: drop the partition and stream it again from 0.
    reset: bool
    #: Where the partition resumes unless the caller seeks elsewhere (None for repairs: unchanged).
    resume: StreamOffset | None = None


@dataclass(frozen=True, slots=True)
class Send:
    message: Any


@dataclass(frozen=True, slots=True)
class Deliver:
    message: Any


@dataclass(frozen=True, slots=True)
class StreamEnded:
    partition: int
    reason: str
    last_seqno: int | None
    #: the ``until_now`` end first taken, when it was lowered after a history branch
    lowered_from: int | None
    then: EndAction


@dataclass(frozen=True, slots=True)
class Repair:
    plan: RollbackPlan
    #: True for the repair of unsaved progress found at a handshake (``finish_repair``), False for
    #: a server rollback (``finish_rollback``)
    unsaved: bool = False


@dataclass(frozen=True, slots=True)
class Reconnect:
    reason: str


@dataclass(frozen=True, slots=True)
class Moved:
    """The partition is not (or no longer) active on this connection's node: a session that
    follows the partition map hands it to its new node instead of reconnecting here."""

    partition: int
    #: ``not_my_partition`` or the stream end reason (``state_changed``)
    reason: str
    #: the map revision the node named, when it named one
    revision: int | None = None
    detail: str | None = None


Action = Union[Send, Deliver, StreamEnded, Repair, Reconnect, Moved]
