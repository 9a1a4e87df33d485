"""The replicas' progress as etcd's watch reports it: kept up to date from watch events.

WHY: every replica node publishes its copies' progress a few times a second under writes, and
each publish is a change under the cluster's prefix.  Re-reading the whole progress prefix (a key
per copy) on every node, for every such change, made the control plane one of the nodes'
largest CPU users at a steady write rate (docs/benchmarks.md, "Replication lag: CPU per
replicated write").  Here a node reads the prefix once, when its watch starts, and applies the
watch's events afterwards.

Consistency: ``reset`` takes a full reading with the store revision it was made at; an event
whose revision is not above that revision is already in the reading and is ignored, so a
reading and the events buffered around it can be applied in any interleaving without going
back in time.  A watch that is restarted (connection lost, compacted) starts with a new full
reading, so nothing that happened while it was down is missed.

The view also counts the watch's other changes (``saw``), so that whoever shares the watch (the
orchestrator on the same node) can tell whether anything it read from etcd may have changed
since, by comparing ``mark()`` with the mark taken before its reading, instead of reading again
on every tick.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping

from app.cluster.etcd import KeyValue, WatchEvent
from app.cluster.layout import Layout
from engine.cluster.promotion import ReplicaProgress

__all__ = ["ProgressView", "parse_progress"]


def parse_progress(value: bytes) -> ReplicaProgress:
    data = json.loads(value)
    return ReplicaProgress(int(data["seqno"]), bool(data["in_sync"]))


class ProgressView:
    """``(partition, node) -> ReplicaProgress`` under ``layout.progress``, from a reading and events."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._prefix = layout.progress
        self.progress: dict[tuple[int, str], ReplicaProgress] = {}
        #: the store revision the state is known up to (-1: no reading yet)
        self.revision = -1
        #: set on every watched change under the cluster's prefix (``notify``): the orchestrator
        #: on the same node waits on one instead of running a watch of its own
        self._subscribers: set[asyncio.Event] = set()
        #: full readings taken (each watch restart), changes other than progress watched, and
        #: of those the ones under the moves' prefixes (``saw``)
        self.readings = 0
        self.changes = 0
        self.moves = 0

    @property
    def ready(self) -> bool:
        """Whether a full reading was taken (before that, the state is empty, not known)."""
        return self.revision >= 0

    def covers(self, key: bytes) -> bool:
        return key.startswith(self._prefix)

    def reset(self, kvs: Iterable[KeyValue], revision: int) -> None:
        """A full reading of the progress prefix, made at store ``revision`` by the watch that
        applies every later change (``ready`` from now on)."""
        self.show(kvs)
        self.revision = revision
        self.readings += 1

    def show(self, kvs: Iterable[KeyValue]) -> None:
        """A reading made without a watch behind it: shown (``GET /cluster``), not ``ready``."""
        self.progress = {self.layout.progress_owner(kv.key): parse_progress(kv.value) for kv in kvs}

    def lost(self) -> None:
        """The watch ended: what is held may miss changes from now on (not ``ready``); the
        progress stays readable for display until the next reading replaces it."""
        self.revision = -1

    def apply(self, event: WatchEvent) -> bool:
        """Apply one watched change of a progress key; True if it changed what a decision
        reads besides a seqno (a copy appeared, went away, or its in-sync status changed)."""
        revision = event.kv.mod_revision
        if revision <= self.revision:
            return False  # already in the reading
        owner = self.layout.progress_owner(event.kv.key)
        old = self.progress.get(owner)
        if event.kind == "delete":
            self.progress.pop(owner, None)
            return old is not None
        new = parse_progress(event.kv.value)
        self.progress[owner] = new
        return old is None or old.in_sync != new.in_sync

    def saw(self, *, move: bool = False) -> None:
        """The watch applied a change other than progress (``move``: a handover's or a
        rebalance's key): a reading taken before it may be out of date."""
        self.changes += 1
        if move:
            self.moves += 1

    def mark(self) -> tuple[int, int] | None:
        """What the watch has seen so far (None: no watch behind the view).  Equal marks taken
        before two readings of anything under the cluster's prefix but progress mean nothing
        changed between them, since a change is counted when its event arrives, and its event
        arrives only after etcd applied it."""
        return (self.readings, self.changes) if self.ready else None

    def subscribe(self, event: asyncio.Event) -> None:
        self._subscribers.add(event)

    def unsubscribe(self, event: asyncio.Event) -> None:
        self._subscribers.discard(event)

    def notify(self) -> None:
        """Something under the cluster's prefix changed (after the view took it in)."""
        for event in self._subscribers:
            event.set()

    def snapshot(self) -> Mapping[tuple[int, str], ReplicaProgress]:
        """A copy the caller may keep (the view goes on changing)."""
        return dict(self.progress)
