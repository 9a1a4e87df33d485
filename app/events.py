"""The node's event log: a bounded ring of typed operational events (stdlib only).

WHY a ring and not a log file: an operator's console (``GET /ui/``) and ``GET /events?since=ID``
want "what happened lately, in order, with stable ids to resume from", and a node must never grow
memory because nobody reads.  The oldest events fall off; a reader that asks ``since`` an id that
already fell off is told so (``EventPage.truncated``) instead of silently missing events, as a
Kafka consumer is told its offset is out of range.

Any thread may record (the flusher, reader threads, the event loop): one lock guards the ring, and
``on_record`` (set by the adapter) wakes waiting readers without the log knowing about asyncio.

Hooks for other modules are one-line calls that take the engine, which every part of the server
holds: ``events.rollback_answered(engine, ...)``, ``events.rebalance(engine, ...)``.  The log is
found by ``bind(engine, log)`` (done by the app's lifespan); with no log bound they do nothing,
so tools and tests that open an engine without an app need nothing.
"""
from __future__ import annotations

import enum
import itertools
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_CAPACITY", "Event", "EventKind", "EventLog", "EventPage", "Severity", "bind", "log_of",
    "record", "rebalance", "rollback_answered",
]

DEFAULT_CAPACITY = 2048


class EventKind(enum.StrEnum):
    """What happened, as a fixed vocabulary: the console and scripts filter and colour by it."""

    FAILOVER = "failover"            # a partition's active moved away from a node that is down
    PROMOTION = "promotion"          # a partition on this node became active (new history branch)
    TAKEOVER = "takeover"            # a partition's active moved between live nodes (handover)
    REBALANCE = "rebalance"          # replicas added or moved, or an explicit rebalance step
    NODE = "node"                    # a cluster node came up or went down
    ROLLBACK = "rollback"            # a consumer was told to roll back
    UNCLEAN_RESTART = "unclean_restart"  # the engine opened after a stop that did not flush
    FLUSH_ERROR = "flush_error"      # flushing to disk fails (disk full, I/O error)
    FLUSH_RECOVERED = "flush_recovered"
    STATE = "state"                  # a partition changed state on this node


class Severity(enum.StrEnum):
    """How urgently an operator should look (the console's colour, a monitoring script's filter)."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Event:
    """One recorded event; frozen, because readers on any thread share the ring's objects."""

    id: int
    #: wall-clock seconds (epoch): what an operator correlates with other logs
    time: float
    kind: EventKind
    severity: Severity
    message: str
    partition: int | None = None
    node: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "time": self.time, "kind": self.kind.value, "severity": self.severity.value,
            "message": self.message, "partition": self.partition, "node": self.node, "details": dict(self.details),
        }


@dataclass(frozen=True, slots=True)
class EventPage:
    """One read of the log: the events plus what a reader needs to resume without missing any."""

    events: list[Event]
    #: the id the next ``since`` should carry (the newest id so far, even when ``events`` is empty)
    last_id: int
    #: events after ``since`` fell off the ring before this read: the reader missed some
    truncated: bool
    #: ``since`` was beyond the newest id: this is another log (the node restarted), read from its start
    reset: bool = False


class EventLog:
    """At most ``capacity`` events, newest last, ids growing from 1."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, clock: Callable[[], float] = time.time) -> None:
        if capacity < 1:
            raise ValueError("an event log holds at least one event")
        self._ring: deque[Event] = deque(maxlen=capacity)
        #: names this log: ids restart at 1 with every process, so a reader that kept an id from
        #: before a restart learns from a different ``log_id`` that its id means nothing here
        self.log_id = secrets.token_hex(8)
        self._ids = itertools.count(1)
        self._last_id = 0
        self._lock = threading.Lock()
        self._clock = clock
        #: called (from the recording thread) after each event; the adapter wakes readers with it
        self.on_record: Callable[[Event], None] | None = None

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0

    @property
    def last_id(self) -> int:
        return self._last_id

    def __len__(self) -> int:
        return len(self._ring)

    def record(self, kind: EventKind, message: str, *, severity: Severity = Severity.INFO,
               partition: int | None = None, node: str | None = None,
               details: Mapping[str, Any] | None = None) -> Event:
        with self._lock:
            event = Event(next(self._ids), self._clock(), kind, severity, message, partition, node,
                          dict(details or {}))
            self._ring.append(event)
            self._last_id = event.id
        callback = self.on_record
        if callback is not None:
            callback(event)
        return event

    def since(self, since: int = 0, limit: int = 500, log_id: str | None = None) -> EventPage:
        """Events with ``id > since``, oldest first, at most ``limit`` of them.  ``log_id``: the
        log ``since`` came from; another one (a restarted node) reads from the start."""
        with self._lock:
            events = list(self._ring)
            last = self._last_id
        reset = since > last or (log_id is not None and log_id != self.log_id)
        if reset or since < 0:
            since = 0
        oldest = events[0].id if events else last + 1
        truncated = since + 1 < oldest
        newer = [e for e in events if e.id > since][:max(0, limit)]
        return EventPage(newer, newer[-1].id if newer else since, truncated, reset)


_logs: weakref.WeakKeyDictionary[Any, EventLog] = weakref.WeakKeyDictionary()


def bind(engine: Any, log: EventLog) -> None:
    """Make ``log`` the one hooks given ``engine`` record into (the app does it once the engine opens)."""
    _logs[engine] = log


def log_of(engine: Any) -> EventLog | None:
    try:
        return _logs.get(engine)
    except TypeError:  # not weak-referenceable: a test double
        return None


def record(engine: Any, kind: EventKind, message: str, **fields: Any) -> None:
    """Record on ``engine``'s log, or do nothing when no app bound one."""
    log = log_of(engine)
    if log is not None:
        log.record(kind, message, **fields)


def rollback_answered(engine: Any, stream: str, remote: str, response: Any) -> None:
    """A stream request was answered with a rollback (``response``: the protocol's StreamResponse):
    which partition, to which seqno, by which rule (``reason``), and the rule's own explanation,
    which names the position the consumer asked for."""
    log = log_of(engine)
    if log is None:
        return
    reason = str(getattr(response, "reason", "") or "")
    log.record(
        EventKind.ROLLBACK,
        f"stream {stream or '?'} ({remote}) told to roll back partition {response.partition} to seqno "
        f"{response.rollback_seqno} ({reason})",
        severity=Severity.WARNING, partition=response.partition,
        details={"stream": stream, "remote": remote, "rollback_seqno": response.rollback_seqno, "rule": reason,
                 "detail": getattr(response, "detail", "")},
    )


def rebalance(engine: Any, message: str, *, partition: int | None = None, node: str | None = None,
              **details: Any) -> None:
    """A rebalance step (a replica added, moved or dropped; a rebalance started or finished)."""
    record(engine, EventKind.REBALANCE, message, partition=partition, node=node, details=details)
