"""``GET /events?since=ID``: the node's event log (``app.events``), pushed by long polling.

WHY long polling and not a WebSocket: the answer is plain JSON any tool reads (curl, a
monitoring script), authenticated by the usual ``Authorization`` header, and a reader that
sends ``Prefer: wait=N`` (RFC 7240's preference for exactly this) is answered the moment an
event is recorded, which is the push the console needs.  Waiting readers are limited
(``MAX_WAITERS``); past the limit a request is answered at once, as if it had not asked to
wait, so a client cannot pin the node's connections.
"""
from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from app.deps import ReadCtx
from app.events import EventLog
from app.problems import INVALID_INPUT, Problem
from app.routes.responses import problems

router = APIRouter(tags=["status"])

MAX_WAIT_S = 25.0
MAX_WAITERS = 64
_QUERY = frozenset({"since", "limit", "log"})
_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d{1,6})(?:\.\d+)?(?=$|[,;\s])", re.IGNORECASE)


def preferred_wait(prefer: str | None) -> float:
    """Seconds asked for by ``Prefer: wait=N`` (RFC 7240), capped at ``MAX_WAIT_S``; 0 without one.
    A preference the server cannot honour is ignored, as RFC 7240 says, never an error."""
    match = _PREFER_WAIT.search(prefer or "")
    return min(float(match.group(1)), MAX_WAIT_S) if match else 0.0


class EventOut(BaseModel):
    id: int
    time: float = Field(description="seconds since the epoch")
    kind: str = Field(description="failover, promotion, takeover, rebalance, node, rollback, unclean_restart, "
                                  "flush_error, flush_recovered, state")
    severity: str = Field(description="info, warning or error")
    message: str
    partition: int | None
    node: str | None
    details: dict[str, Any]


class EventList(BaseModel):
    events: list[EventOut]
    last_id: int = Field(description="pass it as `since` to get what follows")
    truncated: bool = Field(description="events after `since` fell off the ring (it holds the newest "
                                        "`capacity`): some were missed")
    reset: bool = Field(description="`since` was past the newest id: the node restarted and this is its new "
                                    "log, read from the start")
    capacity: int
    log_id: str = Field(description="names this log (ids restart with the node): pass it back as `log`")


class EventFeed:
    """Wakes long-polling readers when the log records (from any thread)."""

    def __init__(self, log: EventLog, loop: asyncio.AbstractEventLoop) -> None:
        self.log = log
        self._loop = loop
        self._changed = asyncio.Event()
        self.waiters = 0
        self._closing = False
        log.on_record = self._recorded

    def _recorded(self, _event: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop closed (shutdown) while a thread recorded: nobody waits
            pass

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self, since: int, timeout: float, log_id: str | None = None) -> None:
        """Return once the log holds an id past ``since`` (or a reset), or after ``timeout``."""
        if self.log.last_id != since or timeout <= 0 or self.waiters >= MAX_WAITERS or self._closing:
            return
        if log_id is not None and log_id != self.log.log_id:
            return
        self.waiters += 1
        try:
            changed = self._changed
            if self.log.last_id == since:
                async with asyncio.timeout(timeout):
                    await changed.wait()
        except TimeoutError:
            pass
        finally:
            self.waiters -= 1

    def close(self) -> None:
        """Answer every waiting reader now, and every later one at once: the node is shutting
        down, and the server's graceful shutdown waits for requests in flight, so a reader
        left waiting would hold the node's exit for its whole wait (then get an error)."""
        self._closing = True
        self._wake()

    def detach(self) -> None:
        self.close()
        self.log.on_record = None


@router.get("/events", summary="Node events (failovers, rollbacks, unclean restarts, flush errors)",
            response_model=EventList, responses=problems(401, 403, 422, 503))
async def list_events(
    request: Request,
    ctx: ReadCtx,
    since: Annotated[int, Query(ge=0, le=2**63 - 1, description="last id already seen (0: from the oldest kept)")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    log: Annotated[str | None, Query(max_length=64, description="the `log_id` that `since` came from")] = None,
) -> EventList:
    """Events with an id greater than `since`, oldest first.  With `Prefer: wait=N` (seconds, at
    most 25) and nothing new, the answer waits until an event is recorded (long polling).  Ids restart with the node: pass the
    `log_id` of the answer `since` came from as `log`, and after a restart the answer says
    `reset` and starts from the new log's first event."""
    unknown = sorted(set(request.query_params) - _QUERY)
    if unknown:  # a misspelt `since` would otherwise read the whole log, silently
        raise Problem(INVALID_INPUT, f"unknown query parameter {unknown[0]!r}; known: limit, log, since",
                      field=f"query.{unknown[0]}")
    events: EventLog = request.app.state.events
    log_id = log
    feed: EventFeed | None = getattr(request.app.state, "event_feed", None)
    wait_s = preferred_wait(request.headers.get("prefer"))
    if feed is not None and wait_s > 0:
        await feed.wait(since, wait_s, log_id)
    page = events.since(since, limit, log_id)
    return EventList(events=[EventOut(**e.to_dict()) for e in page.events], last_id=page.last_id,
                     truncated=page.truncated, reset=page.reset, capacity=events.capacity, log_id=events.log_id)
