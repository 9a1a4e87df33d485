"""Change notifications from the engine's writer thread to the stream connections' event loop.

Theory of operation
-------------------
``Engine.add_listener`` calls its callback on the writer's thread after every queued write batch
and after partition state changes.  A stream connection tails live changes by waiting on an
``asyncio.Event``; setting that event from another thread needs ``loop.call_soon_threadsafe``.

WHY one hub per app instead of one listener per connection: at 20k writes/s and 50 consumers a
listener per connection would schedule a million loop callbacks per second.  The hub coalesces
(``app.stream.coalesce``): a busy writer costs the loop one callback per loop iteration,
whatever the write rate, and the callback hands the set of changed partitions to every
subscriber.

With many subscribers the hub wakes the streams at most once per few milliseconds, and gathers a
few milliseconds of changes on a busy loop (``app.stream.pacing``): fewer, fuller passes, never a
held write after a quiet spell.  Replication
connections are *prompt* subscribers (``set_prompt``): never paced and not counted for pacing,
because a replica's position gates majority acknowledgements (a held wake-up is added to every
majority write's latency) and a node's few replication streams are not what loads its loop.

Ordering (needed by barrier cookies): the callback is scheduled before ``Engine.write`` returns,
hence before the writer's HTTP acknowledgement, hence before a consumer that saw that
acknowledgement can send a cookie.  ``call_soon_threadsafe`` appends to the loop's ready queue at
once, so the notification is processed before the socket read that carries the cookie.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from app.stream.coalesce import CoalescedPartitions
from app.stream.jobs import JobBatcher
from app.stream.pacing import WakePacer
from app.stream.tailcache import TailCache

if TYPE_CHECKING:
    from app.stream.shared import SharedReadings

__all__ = ["ChangeHub", "Subscriber"]


class Subscriber(Protocol):
    def notify(self, partitions: frozenset[int]) -> None:
        """Called on the event loop with the partitions that changed since the last call."""


class ChangeHub:
    """Fans engine change notifications out to subscribers on one event loop."""

    def __init__(self, add_listener: Callable[[Callable[[int], None]], Callable[[], None]],
                 loop: asyncio.AbstractEventLoop, jobs: JobBatcher | None = None,
                 shared: Callable[[TailCache], "SharedReadings"] | None = None,
                 pacer: WakePacer | None = None, batch_listener: bool = False) -> None:
        self._loop = loop
        self._changes = CoalescedPartitions(loop, self._deliver)
        #: wakes the streams at once on an idle loop, a few writes at a time on a busy one (pacing.py)
        self.pacer = pacer if pacer is not None else WakePacer()
        self._release_timer: asyncio.TimerHandle | None = None
        self._subscribers: set[Subscriber] = set()
        #: the subparts of ``_subscribers``: woken through the pacer, or always at once
        self._paced: set[Subscriber] = set()
        self._prompt: set[Subscriber] = set()
        #: encoded tail snapshots shared by the connections (see tailcache.py)
        self.cache = TailCache()
        #: encoded readings of the write queue for shared passes (see shared.py); None: none
        self.shared = shared(self.cache) if shared is not None else None
        #: stream jobs of all connections batched into one reader-thread hop (see jobs.py)
        self.jobs = jobs
        #: ``batch_listener``: ``add_listener(cb, batch=True)`` hands each write's partitions at
        #: once (``Engine.add_listener``), so a delivery never carries half a write
        self._remove = (add_listener(self._on_changes, batch=True)  # type: ignore[call-arg]
                        if batch_listener else add_listener(self._on_change))

    # ---------------------------------------------------------------- writer thread
    def _on_change(self, partition: int) -> None:
        self._changes.mark(partition)

    def _on_changes(self, partitions: Iterable[int]) -> None:
        self._changes.mark_many(partitions)

    # ---------------------------------------------------------------- event loop
    def _deliver(self, dirty: frozenset[int]) -> None:
        if self._prompt:
            self._fan_out(self._prompt, dirty)
        pacer = self.pacer
        out = pacer.offer(dirty, self._changes.delay, len(self._paced), self._loop.time())
        if out is None:
            if self._release_timer is None:
                at = pacer.release_at
                self._release_timer = (self._loop.call_at(at, self._release) if at is not None
                                       else self._loop.call_later(pacer.gather_s, self._release))
            return
        self._fan_out(self._paced, out)

    def _release(self) -> None:
        self._release_timer = None
        held = self.pacer.release(self._loop.time())
        if held and not self._changes.closed:
            self._fan_out(self._paced, held)

    @staticmethod
    def _fan_out(subscribers: set[Subscriber], dirty: frozenset[int]) -> None:
        for subscriber in tuple(subscribers):
            subscriber.notify(dirty)

    def subscribe(self, subscriber: Subscriber, *, prompt: bool = False) -> None:
        """``prompt``: always woken at once, and not counted for pacing (see ``set_prompt``)."""
        self._subscribers.add(subscriber)
        (self._prompt if prompt else self._paced).add(subscriber)

    def set_prompt(self, subscriber: Subscriber) -> None:
        """``subscriber`` turned out to be a replication stream (its hello): never paced from now on."""
        if subscriber in self._subscribers:
            self._paced.discard(subscriber)
            self._prompt.add(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)
        self._paced.discard(subscriber)
        self._prompt.discard(subscriber)

    @property
    def subscribers(self) -> Iterable[Subscriber]:
        return tuple(self._subscribers)

    def close(self) -> None:
        """Stop listening to the engine (idempotent)."""
        if self._changes.close():
            self._remove()
            if self._release_timer is not None:
                self._release_timer.cancel()
                self._release_timer = None
