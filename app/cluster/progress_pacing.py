"""When a replica copy's progress is worth an etcd write: at once when what it means changes,
seldom while it only keeps moving.

Under a steady write rate every copy's last whole snapshot moves on nearly every publish tick,
so publishing each change costs this node an etcd transaction per tick and every node's watch
an event per copy per tick (the replicating pair's largest control-plane cost,
docs/benchmarks.md "Cluster").  What reads it does not need every step:

* whether a copy is in sync decides who may be promoted and when a rebalance may move on: a
  change of it is published on the next tick;
* the seqno matters once it stops moving: a dead or paused active stops feeding its replicas,
  a handover's source stops taking writes, and then the orchestrator compares the copies'
  final figures or waits for a target to reach a seqno.  A copy whose stream is lost publishes
  on the next tick; one whose seqno stayed put for ``settle_s`` too, so those figures reach
  etcd well inside a lease TTL.  (Not after a single quiet tick: at a few writes per second per
  partition many copies have a quiet tick every time, and would publish as often as before.);
* while the seqno keeps moving it is published at most every ``max_age_s``, so readers of
  ``GET /cluster`` still see it advance; on a tick that writes to etcd anyway, a moving copy
  at least half that old rides along (``riding``), so the moving copies fall into step and
  share one transaction instead of each paying its own on a tick of its own.

Pure: ``ReplicationStreams.publish_once`` asks ``due`` per copy and tick.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.cluster.replica_sync import Progress

__all__ = ["PublishPacer"]


@dataclass
class _Copy:
    seen: Progress | None = None  # what the last tick saw
    moved_at: float = 0.0  # when a tick last saw it change
    reported: Progress | None = None  # what etcd last got
    published_at: float | None = None  # when


class PublishPacer:
    """Per copy (partition), whether this tick's progress should be published."""

    def __init__(self, max_age_s: float, settle_s: float) -> None:
        self.max_age_s = max_age_s
        self.settle_s = settle_s
        self._copies: dict[int, _Copy] = {}

    def due(self, partition: int, now: float, progress: Progress, *, stream_lost: bool = False,
            riding: bool = False) -> bool:
        """``progress`` is what the copy holds at ``now``, ``stream_lost`` whether its stream is
        down, ``riding`` whether this tick publishes other copies anyway; True if it should be
        published now (then call ``published`` once etcd has it)."""
        copy = self._copies.setdefault(partition, _Copy(moved_at=now))
        if progress != copy.seen:
            copy.seen, copy.moved_at = progress, now
        reported = copy.reported
        if progress == reported:
            return False
        if reported is None or progress.in_sync != reported.in_sync or stream_lost:
            return True
        if now - copy.moved_at >= self.settle_s:  # settled: its final figure is what readers compare
            return True
        max_age = self.max_age_s / 2 if riding else self.max_age_s
        return copy.published_at is None or now - copy.published_at >= max_age

    def published(self, partition: int, now: float, progress: Progress) -> None:
        copy = self._copies.setdefault(partition, _Copy(moved_at=now))
        copy.reported, copy.published_at = progress, now

    def forget(self, partition: int) -> None:
        """The copy is gone (its progress withdrawn): a new one starts from nothing published."""
        self._copies.pop(partition, None)
