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

``--server`` may name several nodes (``URL[,URL...]``): any node will do for the first hop, so a
client tries them in order and moves on only when a connection could not be made (nothing was
sent, so a write is never applied twice).

Pure: no sockets; ``clients.http`` does the requests.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.protocol.client.servers import parse_servers

__all__ = ["MAX_HOPS", "MISDIRECTED_STATUS", "parse_servers", "redirect_target", "revisit_delay"]

#: 421s followed for one request before giving up.
MAX_HOPS = 3
MISDIRECTED_STATUS = 421


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


def revisit_delay(hops: int) -> float:
    """Seconds to wait before asking again a node already asked, after ``hops`` hops: 0.1, 0.2,
    0.4 ... capped at 1 (a map change spreads in a watch round trip, tens of milliseconds)."""
    return min(0.1 * (2 ** hops), 1.0)
