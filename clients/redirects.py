"""Where a document request goes in a cluster: the servers a user named, and the 421s that redirect.

A cluster node that is not active for a key's partition answers ``421 misdirected-request`` with
the active node's URL in the problem body (``url``).  A client follows it, as Couchbase SDKs
follow ``NOT_MY_VBUCKET`` with the newest map and Kafka clients follow ``NOT_LEADER``: a bounded
number of hops (a map that moves while a request is in flight can send it on once more, but a
loop between stale nodes must end), then a typed error naming the last answer.

While a new map spreads, two nodes can each name the other (one has read the new map, the other
not yet); a client sent back to a node it already asked waits a moment first
(``revisit_delay``), so the hops usually outlast the disagreement instead of spending themselves
in a few milliseconds.

A write that reaches a node while its partition changes hands (the new owner before it took over,
the old one after it let go) is answered ``503 partition-not-active``: nothing was applied, so a
client asks the same node again after a short wait, as Couchbase SDKs retry ``NOT_MY_VBUCKET`` and
Kafka producers retry ``NOT_LEADER_OR_FOLLOWER``, a bounded number of times
(``DocumentRoute``).  The waits are ``clients.backoff.Backoff``'s: the first one short (a handover
pauses a partition for a fraction of a second), growing, capped, and jittered, so the many writers
one handover turned away do not all come back in the same millisecond.

``--server`` may name several nodes (``URL[,URL...]``): any node will do for the first hop, so a
client tries them in order and moves on only when a connection could not be made (nothing was
sent, so a write is never applied twice).

Pure: no sockets; ``clients.http`` does the requests.
"""
from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.protocol.client.servers import parse_servers

from .backoff import Backoff

__all__ = ["MAX_HOPS", "MAX_RETRIES", "MISDIRECTED_STATUS", "DocumentRoute", "Hop", "is_moving", "moving_backoff",
           "parse_servers", "redirect_target", "revisit_delay"]

#: 421s followed for one request before giving up.
MAX_HOPS = 3
#: 503 partition-not-active answers asked again for one request: with ``moving_backoff``'s waits
#: 1.1 to 2.2 s in all, past the write pause of a handover (bench/cluster_rebalance.py).
MAX_RETRIES = 10
MISDIRECTED_STATUS = 421
UNAVAILABLE_STATUS = 503


def redirect_target(status: int, body: Any, current: str) -> str | None:
    """The node a 421 answer names (its base URL), or None when the answer is no redirect to
    follow: not a 421, no active node right now, or the same node again."""
    if status != MISDIRECTED_STATUS or not isinstance(body, Mapping):
        return None
    url = body.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return None
    url = url.rstrip("/")
    return None if url == current.rstrip("/") else url


def is_moving(status: int, body: Any) -> bool:
    """A ``503 partition-not-active`` answer: the partition is not served here right now (it is
    being handed over or promoted), and the write was not applied."""
    if status != UNAVAILABLE_STATUS or not isinstance(body, Mapping):
        return False
    kind = body.get("type")
    return isinstance(kind, str) and kind.rsplit("/", 1)[-1] == "partition-not-active"


@dataclass(frozen=True)
class Hop:
    """Ask ``url`` next, after waiting ``delay`` seconds."""

    url: str
    delay: float


class DocumentRoute:
    """The hops of one document request, fed with each answer: where to ask next, or None when the
    answer is the one to give the caller.  The adapters (``clients.http``) only send and sleep."""

    def __init__(self, first: str, max_hops: int = MAX_HOPS, max_retries: int = MAX_RETRIES,
                 backoff: Backoff | None = None) -> None:
        self.server = first
        self.max_hops = max_hops
        self.max_retries = max_retries
        self.redirects = 0
        self.retries = 0
        self._visited = {first}
        #: the waits before each retry of a 503 partition-not-active
        self.backoff = backoff if backoff is not None else moving_backoff()

    def next(self, status: int, body: Any) -> Hop | None:
        """The hop that follows an answer of ``status`` with problem ``body`` from ``self.server``."""
        target = redirect_target(status, body, self.server)
        if target is not None and self.redirects < self.max_hops:
            # two nodes disagree while a map change spreads: give it a moment
            delay = revisit_delay(self.redirects) if target in self._visited else 0.0
            self.redirects += 1
            # a partition moving on the node named now is a new wait: its first retry comes within
            # a few ms, not after the source's longer waits (a handover's target refuses only
            # until its takeover, tens of ms after the source sent the client there)
            self.backoff.reset()
        elif target is None and is_moving(status, body) and self.retries < self.max_retries:
            target, delay = self.server, self.backoff.next_delay()
            self.retries += 1
        else:
            return None
        self._visited.add(target)
        self.server = target
        return Hop(target, delay)

    def describe(self, what: str) -> str:
        """``what``, saying how many redirects and retries it took, for an error message."""
        parts = ([f"following {self.redirects} misdirections"] if self.redirects else []) + \
                ([f"asking {self.retries} more times while the partition moved"] if self.retries else [])
        return f"{what} (after {' and '.join(parts)})" if parts else what


def moving_backoff(rng: random.Random | None = None) -> Backoff:
    """The waits before asking again about a partition that is moving: 10 ms first (most
    handovers end within a few tens of ms of a refusal), doubling to at most 400 ms, each drawn
    from the upper half of its span so writers turned away together spread out."""
    return Backoff(initial=0.01, maximum=0.4, factor=2.0, jitter=0.5, rng=rng)


def revisit_delay(hops: int) -> float:
    """Seconds to wait before asking again a node already asked, after ``hops`` hops: 0.1, 0.2,
    0.4 ... capped at 1 (a map change spreads in a watch round trip, tens of milliseconds)."""
    return min(0.1 * (2 ** hops), 1.0)
