"""Whether a replica copy is catching up or in sync, and what it reports to the orchestrator.

A replica is **catching up** until it holds, whole, a snapshot up to the active's high seqno
*as it was when the stream was requested* (the goal does not move with new writes, or a busy
partition would never arrive), then **in sync** for as long as it keeps streaming (Kafka's ISR,
Liftbridge, JetStream: only a copy that caught up may stand for promotion).

What it reports (``Progress``) is the end of its last whole snapshot, the seqno a promotion
starts its new branch at (``engine.cluster.promotion``).  Losing the connection does not at once
make a copy less in sync: that is exactly what happens when its active dies, and the orchestrator
must still be able to promote it.  But a copy cut off from an active that is still alive misses
the writes that active keeps acknowledging, so once it has been cut off longer than
``max_down_s`` while its active's lease lives, it is no longer in sync (Kafka drops such a
follower from the ISR after ``replica.lag.time.max.ms``).  ``max_down_s`` must exceed the time a
dead active's lease takes to expire, or a dead active's best replica would drop out just before
the orchestrator looks for it.  A new handshake that finds it behind (``requested``) makes it
catch up again.

Pure: the replication adapter (``app.cluster.replication``) feeds it handshakes and the
snapshot ends it applied, and publishes ``changed()`` at a bounded rate (then ``published``).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Progress", "ReplicaSync"]


@dataclass(frozen=True, slots=True)
class Progress:
    """What a replica reports: its last whole snapshot end, and whether it caught up."""

    seqno: int
    in_sync: bool

    def to_json(self) -> dict[str, object]:
        return {"seqno": self.seqno, "in_sync": self.in_sync}


class ReplicaSync:
    """One replica copy of one partition."""

    def __init__(self, complete_seqno: int = 0) -> None:
        self.complete_seqno = complete_seqno
        self.in_sync = False
        #: the active's high seqno at the last stream request: the goal while catching up
        self.goal: int | None = None
        #: when the stream was lost (the caller's clock), None while streaming
        self.down_since: float | None = None
        self._reported: Progress | None = None

    def requested(self, active_high_seqno: int, complete_seqno: int) -> None:
        """A stream was requested while the active's high seqno was ``active_high_seqno``."""
        self.goal = active_high_seqno
        self.complete_seqno = complete_seqno
        self.in_sync = complete_seqno >= active_high_seqno
        self.down_since = None

    def stream_lost(self, now: float) -> None:
        """The connection to the active was lost (or could not be made) at ``now``."""
        if self.down_since is None:
            self.down_since = now

    def tick(self, now: float, active_live: bool, max_down_s: float) -> None:
        """Cut off longer than ``max_down_s`` from an active whose lease lives: no longer in sync."""
        if self.in_sync and active_live and self.down_since is not None and now - self.down_since > max_down_s:
            self.in_sync = False

    def snapshot_applied(self, complete_seqno: int) -> None:
        """A snapshot was applied whole up to ``complete_seqno``."""
        self.complete_seqno = max(self.complete_seqno, complete_seqno)
        if self.goal is not None and self.complete_seqno >= self.goal:
            self.in_sync = True

    def rolled_back(self, complete_seqno: int) -> None:
        """The copy undid its history down to ``complete_seqno``, a whole state of its active's
        branch: it catches up from there (in sync only if that already reaches the goal)."""
        self.complete_seqno = complete_seqno
        self.in_sync = self.goal is not None and complete_seqno >= self.goal

    def reset(self) -> None:
        """The copy was emptied (a rollback it cannot undo): it holds nothing and catches up again."""
        self.complete_seqno = 0
        self.in_sync = False

    @property
    def progress(self) -> Progress:
        return Progress(self.complete_seqno, self.in_sync)

    def changed(self) -> Progress | None:
        """The progress to publish, or None when it is what was last published."""
        now = self.progress
        return None if now == self._reported else now

    def published(self, progress: Progress) -> None:
        """``progress`` reached etcd (a failed publish is retried by the next ``changed``)."""
        self._reported = progress
