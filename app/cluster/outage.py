"""One log line when etcd stops answering a loop, one when it answers again.

Every cluster loop (the map watch, the refresh, the orchestrator, the replica progress) retries
etcd a few times a second while it is away; a line per retry would bury the one fact an operator
needs (Patroni's lesson: an etcd blip is logged, not shouted).  Each loop owns one ``Outage``.
"""
from __future__ import annotations

import logging
import time

log = logging.getLogger("upr.cluster")


class Outage:
    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None
        self.failures = 0

    def failed(self, exc: BaseException) -> None:
        """A call to etcd failed: the first failure of an outage is logged, the rest counted."""
        self.failures += 1
        if self.since is None:
            self.since = time.monotonic()
            log.warning("%s: etcd does not answer (%s); retrying quietly until it does", self.what, exc)

    def ok(self) -> None:
        """A call to etcd succeeded: an outage, if any, is over."""
        if self.since is not None:
            log.warning("%s: etcd answers again after %.1f s (%d failed attempts)", self.what,
                        time.monotonic() - self.since, self.failures)
            self.since, self.failures = None, 0
