"""Visible ceilings: how far a ``persisted`` or ``majority`` consumer may be streamed, and the
wake-up of its streams when that advances.

Theory of operation
-------------------
A consumer that says hello with ``visibility: persisted`` or ``majority`` must never receive a
write that could still be taken back (``engine.protocol.session``, Visibility).  The protocol
session decides with a per-partition *ceiling* it is given; this module supplies it:

    persisted   ``Engine.persisted_seqno(p)``: an unclean restart keeps everything at or below it
    majority    a callable the node supplies (in a cluster, the seqno a majority of the
                partition's copies hold); without one (a single node: no failover can take a
                write back) the stream is not capped, as ``memory``
    memory      no ceiling: the connection never asks, and none of this runs for it

A capped connection subscribes; ceiling advances reach it coalesced on the event loop, as engine
writes reach streams through the ``ChangeHub``: the flusher reports each committed round
(``Engine.add_persist_listener``), the node reports majority advances with ``advanced(p)`` (any
thread).  No polling: a stream waiting at its ceiling sleeps until one of those arrives.  The
persist listener is registered only while some connection is capped, so a server whose
consumers all stream ``memory`` pays nothing for this.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from app.stream.coalesce import CoalescedPartitions
from engine.protocol.messages import Visibility

__all__ = ["CeilingProvider", "CeilingSubscriber", "VisibleCeilings"]

log = logging.getLogger("upr.stream")

#: a partition's visible ceiling now (cheap: it is read on the event loop)
CeilingProvider = Callable[[int], int]


class CeilingSubscriber(Protocol):
    def ceiling_advanced(self, partitions: frozenset[int]) -> None:
        """Called on the event loop with the partitions whose ceiling may have advanced."""


class VisibleCeilings:
    """The ceiling provider of each visibility, and the capped connections to wake."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop,
                 providers: Mapping[Visibility, CeilingProvider] | None = None) -> None:
        self._engine = engine
        self._providers: dict[Visibility, CeilingProvider] = {Visibility.PERSISTED: engine.persisted_seqno}
        self._providers.update(providers or {})
        self._advances = CoalescedPartitions(loop, self._deliver)
        self._subscribers: set[CeilingSubscriber] = set()
        self._remove_listener: Callable[[], None] | None = None

    def provider(self, visibility: Visibility) -> CeilingProvider | None:
        """The ceiling of ``visibility`` (None: not capped)."""
        if visibility is Visibility.MEMORY:
            return None
        return self._providers.get(visibility)

    def set_provider(self, visibility: Visibility, provider: CeilingProvider | None) -> None:
        """Install (or remove) the provider of ``visibility``; connections opened later use it."""
        if visibility is Visibility.MEMORY:
            raise ValueError("memory visibility has no ceiling")
        if provider is None:
            self._providers.pop(visibility, None)
        else:
            self._providers[visibility] = provider

    # ---------------------------------------------------------------- any thread
    def advanced(self, partition: int) -> None:
        """``partition``'s ceiling may have advanced: wake its capped streams (coalesced)."""
        if self._subscribers:
            self._advances.mark(partition)

    # ---------------------------------------------------------------- event loop
    def _deliver(self, dirty: frozenset[int]) -> None:
        for subscriber in tuple(self._subscribers):
            try:
                subscriber.ceiling_advanced(dirty)
            except Exception:  # one connection's fault (e.g. its provider) must not starve the others
                log.exception("visible ceiling of partition(s) %s: a stream failed to take it",
                              ", ".join(map(str, sorted(dirty))))

    def subscribe(self, subscriber: CeilingSubscriber) -> None:
        self._subscribers.add(subscriber)
        if self._remove_listener is None and not self._advances.closed:
            self._remove_listener = self._engine.add_persist_listener(self.advanced)

    def unsubscribe(self, subscriber: CeilingSubscriber) -> None:
        self._subscribers.discard(subscriber)
        if not self._subscribers and self._remove_listener is not None:
            remove, self._remove_listener = self._remove_listener, None
            remove()

    def close(self) -> None:
        """Stop listening to the engine (idempotent)."""
        self._advances.close()
        if self._remove_listener is not None:
            remove, self._remove_listener = self._remove_listener, None
            remove()
