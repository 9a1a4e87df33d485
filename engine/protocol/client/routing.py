"""Which node serves which of a consumer's partitions, as a pure state machine (sans-I/O).

A consumer of a cluster streams each partition from the node the partition map names as its
active, over one connection per node.  Partitions move (failover, takeover), nodes die and come
back, and the map the consumer holds is only ever a recent copy; ``Router`` turns what the
consumer observes into what it must do, so that the adapter (``clients.cluster``) only opens
sockets and reads ``GET /cluster``.

Theory of operation
-------------------
* **Placement.**  Every wanted partition is either *assigned* to exactly one open connection, or
  *waiting* (to be placed at the next map, or held back, see below), or *unserved* (the map names
  no active node for it, or that node has no URL).  A connection belongs to one node and is
  opened for a fixed set of partitions; a stream request must be named in its ``hello``, so a
  partition that moves to a node already holding a connection gets a connection of its own
  rather than interrupting the streams that are fine where they are.  A connection that lost its
  last partition is closed.
* **Events.**  ``map_loaded`` (a map read from any node), ``partition_moved`` (its stream ended
  with ``state_changed``, or its request was answered ``not_my_partition``, possibly naming the
  map revision of the node that said so), ``connection_lost``, ``revision_seen`` (a newer map
  revision heard of) and ``map_failed`` (no node answered the map).  Each returns the actions to
  carry out in order: ``Open``, ``Close``, ``Reload`` and ``Unserved``.
* **Stale maps.**  Revisions only grow; a map older than one already loaded or heard of is
  ignored (a node that has not caught up with etcd yet answers with an old one), and the map is
  read again until the newest revision heard of arrives.
* **Holding back.**  A partition that left a node (its stream ended there, its connection broke)
  goes back to that same node only after a growing delay: right after a failover the map may
  still name the dead node, and a node may refuse a partition its map no longer gives it before
  every node read the new map.  Placing it anywhere else happens at once.  The delay starts at
  ``initial_delay`` and doubles per consecutive return to the same node, up to ``max_delay``.
  Only the dial backs off: while a partition is held back the map is read every ``poll_delay``,
  because a failover names the new active as soon as the dead node's lease expires, and waiting
  for the hold to end would add up to ``max_delay`` to every moved partition's pause.
* **"Not yet" is not "wrong node".**  A node that refuses a partition (``not_my_partition``)
  which the map held (at the revision the node names, or a newer one) gives to that very node is
  late, not wrong: it has the map but has not applied its own promotion yet (a node applies its
  promotions one after the other, the last a few hundred milliseconds after the map).  A refusal
  naming another node as the server is a handover under way and backs off like a move.  Such a refusal
  holds the partition back with the same doubling delay but only up to ``refusal_delay``, not
  ``max_delay``, at most ``refusals_per_revision`` times per map revision; past that the node is
  treated as one that keeps refusing and the full doubling delay applies, so a node is never
  dialled in a loop.
* **Map reloads** are asked for (``Reload(delay)``) whenever a partition waits: at once after a
  move or a lost connection (after a "not yet" refusal: when its hold ends, the map held already
  sends the partition back there), then with the same growing delay while map reads fail, and
  every ``poll_delay`` (at the latest when its hold ends) while a partition is held back.  While a
  partition has no live active (*unserved*) the map is read every ``poll_delay`` too, for the
  first ``unserved_poll_s`` of the spell (a failover names the new active one lease after the
  death, and a doubling delay would add up to its last step to it), then with the growing delay
  (an outage of hours is not polled several times a second).  ``reload_at`` is the one pending
  reload time; a reload is never asked for twice.
* **Unserved partitions** are reported when they become unserved (``Unserved``), retried with
  every reload, and never fatal: a consumer outlives a cluster without a copy of a partition.

Times are plain floats supplied by the caller (``time.monotonic()``), so every rule is tested
with tables and without a clock.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from .errors import UsageError

__all__ = ["MapView", "Open", "Close", "Reload", "Unserved", "RouteAction", "Router", "revision_in",
           "served_by_in", "MapFormatError"]


class MapFormatError(UsageError):
    """A ``GET /cluster`` answer without the fields a consumer needs."""


@dataclass(frozen=True, slots=True)
class MapView:
    """What a consumer needs of the partition map: its revision, each partition's active node
    (None: no active), and each node's URL (None: the node is down)."""

    revision: int
    actives: Mapping[int, str | None]
    urls: Mapping[str, str | None]

    @property
    def num_partitions(self) -> int:
        return len(self.actives)

    def url_of(self, partition: int) -> tuple[str | None, str | None]:
        """(active node, its URL) of ``partition``; either may be None."""
        node = self.actives.get(partition)
        return node, (self.urls.get(node) if node is not None else None)

    @classmethod
    def from_cluster_json(cls, data: Any) -> "MapView":
        """Parse a ``GET /cluster`` answer (``nodes``: name, state, url; ``map``: revision,
        partitions with their active)."""
        try:
            urls: dict[str, str | None] = {}
            for node in data["nodes"]:
                name = str(node["name"])
                url = node.get("url")
                urls[name] = str(url).rstrip("/") if url and node.get("state", "up") == "up" else None
            m = data["map"]
            revision = int(m["revision"])
            actives: dict[int, str | None] = {}
            for entry in m["partitions"]:
                active = entry.get("active")
                actives[int(entry["partition"])] = str(active) if active is not None else None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MapFormatError(f"the cluster view has no usable partition map: {exc!r}") from None
        if revision < 0 or sorted(actives) != list(range(len(actives))):
            raise MapFormatError(f"the cluster view's map is malformed (revision {revision}, "
                                 f"{len(actives)} partitions not numbered 0..n-1)")
        return cls(revision, actives, urls)


@dataclass(frozen=True, slots=True)
class Open:
    """Open connection ``conn`` to ``node`` at ``url`` and stream ``partitions`` on it (from their
    saved positions)."""

    conn: int
    node: str
    url: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Close:
    """Close connection ``conn``: its partitions (if any) are waiting to be placed again."""

    conn: int
    node: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Reload:
    """Read the map again after ``delay`` seconds (0: now)."""

    delay: float


@dataclass(frozen=True, slots=True)
class Unserved:
    """These partitions have no active node with a URL now: report them (they are retried)."""

    partitions: tuple[int, ...]
    reason: str


RouteAction = Union[Open, Close, Reload, Unserved]

_REVISION = re.compile(r"map revision (\d+)")


def revision_in(detail: str | None) -> int | None:
    """The map revision a ``not_my_partition`` detail names ("... (map revision 7; served by n2)")."""
    if not detail:
        return None
    found = _REVISION.search(detail)
    return int(found.group(1)) if found else None


_SERVED_BY = re.compile(r"served by node (\S+) at ")


def served_by_in(detail: str | None) -> str | None:
    """The node a ``not_my_partition`` detail names as serving the partition, per the refusing
    node's map ("... served by node n2 at http://..."); None when it names none."""
    found = _SERVED_BY.search(detail or "")
    return found.group(1) if found else None


@dataclass(slots=True)
class _Connection:
    node: str
    url: str
    partitions: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Hold:
    node: str
    until: float
    #: consecutive returns to ``node`` that backed off (doubling delay); 0: none yet
    attempts: int
    #: "not yet" refusals by ``node`` under map ``revision``
    refusals: int = 0
    revision: int = -1


class Router:
    """See the module docstring."""

    def __init__(self, wanted: Iterable[int] | None = None, *, initial_delay: float = 0.05,
                 max_delay: float = 2.0, poll_delay: float = 0.2, refusal_delay: float = 0.1,
                 refusals_per_revision: int = 20, unserved_poll_s: float = 30.0) -> None:
        if not 0 < initial_delay <= max_delay:
            raise UsageError(f"need 0 < initial_delay <= max_delay, got {initial_delay} and {max_delay}")
        if not poll_delay > 0:
            raise UsageError(f"need poll_delay > 0, got {poll_delay}")
        if not refusal_delay > 0:
            raise UsageError(f"need refusal_delay > 0, got {refusal_delay}")
        if refusals_per_revision < 0 or unserved_poll_s < 0:
            raise UsageError(f"need refusals_per_revision >= 0 and unserved_poll_s >= 0, got "
                             f"{refusals_per_revision} and {unserved_poll_s}")
        self.poll_delay = poll_delay
        self.refusal_delay = refusal_delay
        self.refusals_per_revision = refusals_per_revision
        self.unserved_poll_s = unserved_poll_s
        self.wanted: tuple[int, ...] | None = tuple(sorted(set(wanted))) if wanted is not None else None
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        self.map: MapView | None = None
        #: highest revision loaded; -1 before the first map
        self.revision = -1
        #: highest revision heard of (loaded or named by a node); the map is read until it arrives
        self.seen_revision = -1
        self.connections: dict[int, _Connection] = {}
        self.assigned: dict[int, int] = {}
        self.unserved: set[int] = set()
        #: partitions whose bounded stream ended: never placed again
        self.done: set[int] = set()
        self.holds: dict[int, _Hold] = {}
        self.reload_at: float | None = None
        self._reload_failures = 0
        self._unserved_polls = 0
        #: when the current spell of unserved partitions began (None: every partition is served)
        self._unserved_since: float | None = None
        self._next_conn = 1

    # ------------------------------------------------------------------ queries
    @property
    def partitions(self) -> tuple[int, ...]:
        """The partitions this consumer follows (all of the map's when none were named)."""
        if self.wanted is not None:
            return self.wanted
        return tuple(range(self.map.num_partitions)) if self.map is not None else ()

    def node_of(self, partition: int) -> str | None:
        conn = self.assigned.get(partition)
        return self.connections[conn].node if conn is not None else None

    def waiting(self) -> tuple[int, ...]:
        """Partitions on no connection now (unserved, held back or not placed yet)."""
        return tuple(p for p in self.partitions if p not in self.assigned and p not in self.done)

    # ------------------------------------------------------------------ events
    def map_loaded(self, view: MapView, now: float) -> list[RouteAction]:
        """A map was read; returns what to open, close, report and when to read it again."""
        if not view.actives:  # a cluster that has not placed its partitions yet: read again later
            if self.reload_at is not None and self.reload_at <= now:
                self.reload_at = None
            self._reload_failures += 1
            return self._reload(now, self._delay(self._reload_failures))
        if self.wanted is not None:
            bad = [p for p in self.wanted if p not in view.actives]
            if bad:
                raise UsageError(f"partition {bad[0]} out of range: the cluster has {view.num_partitions}",
                                 partition=bad[0], field="partitions")
        if self.reload_at is not None and self.reload_at <= now:
            self.reload_at = None  # this read is the one that was due
        if view.revision < self.revision:
            return self._reload_if_needed(now)
        if view.revision >= self.seen_revision:
            self._reload_failures = 0
        self.reload_at = None  # this map supersedes any read still pending; _place asks again
        self.map = view
        self.revision = view.revision
        self.seen_revision = max(self.seen_revision, view.revision)
        actions: list[RouteAction] = []
        # a connection whose node the map no longer gives all its partitions is closed, and its
        # partitions placed again from their saved positions (never two streams of a partition)
        for conn_id, conn in sorted(self.connections.items()):
            if any(view.url_of(p) != (conn.node, conn.url) for p in conn.partitions):
                actions.append(self._close(conn_id))
        return actions + self._place(now)

    def partition_moved(self, conn: int, partition: int, now: float, revision: int | None = None, *,
                        refused: bool = False, served_by: str | None = None) -> list[RouteAction]:
        """``partition``'s stream on ``conn`` ended because its node is not (or no longer) its
        active: ``state_changed``, or (``refused``) ``not_my_partition`` naming ``revision`` and
        the node that serves the partition in the refusing node's eyes (``served_by``)."""
        c = self.connections.get(conn)
        if c is None or partition not in c.partitions:
            return []  # the connection was closed meanwhile: the partition is already waiting
        c.partitions.discard(partition)
        del self.assigned[partition]
        not_yet = refused and served_by in (None, c.node) and self._not_yet(partition, c.node, revision)
        if not_yet:
            self._refused(partition, c.node, now)
        else:
            self._hold(partition, c.node, now)
        actions: list[RouteAction] = []
        if not c.partitions:
            actions.append(self._close(conn))
        if revision is not None:
            self.seen_revision = max(self.seen_revision, revision)
        # the map held already sends it back to that node: read it (and retry) when the hold ends
        return actions + self._reload(now, self.holds[partition].until - now if not_yet else 0.0)

    def connection_lost(self, conn: int, now: float) -> list[RouteAction]:
        """Connection ``conn`` broke (or would not open): its partitions wait for the map."""
        c = self.connections.get(conn)
        if c is None:
            return []
        for p in c.partitions:
            self._hold(p, c.node, now)
        actions: list[RouteAction] = [self._close(conn)]
        return actions + self._reload(now, 0.0)

    def finished(self, conn: int, partitions: Iterable[int]) -> list[RouteAction]:
        """Bounded streams of ``partitions`` on ``conn`` reached their end: never placed again;
        the connection closes once nothing else streams on it."""
        c = self.connections.get(conn)
        for p in partitions:
            self.done.add(p)
            self.holds.pop(p, None)
            self.unserved.discard(p)
            if c is not None and p in c.partitions:
                c.partitions.discard(p)
                del self.assigned[p]
        if c is not None and not c.partitions:
            return [self._close(conn)]
        return []

    def reopen(self, partition: int, now: float) -> list[RouteAction]:
        """A partition whose bounded stream ended is to stream again (the application sought it):
        placed like any waiting partition, from its saved position."""
        if partition not in self.done:
            return []
        self.done.discard(partition)
        return self._place(now) if self.map is not None else []

    def revision_seen(self, revision: int, now: float) -> list[RouteAction]:
        """Some node named map ``revision``: read the map if it is newer than the one held."""
        if revision <= self.seen_revision:
            return []
        self.seen_revision = revision
        return self._reload(now, 0.0) if revision > self.revision else []

    def map_failed(self, now: float) -> list[RouteAction]:
        """No node answered the map: read it again later (growing delay)."""
        if self.reload_at is not None:
            if self.reload_at > now:
                return []  # a read is pending already; this failure was not the one due
            self.reload_at = None
        self._reload_failures += 1
        return self._reload(now, self._delay(self._reload_failures))

    def reload_due(self, now: float) -> bool:
        return self.reload_at is not None and self.reload_at <= now

    # ------------------------------------------------------------------ internals
    def _delay(self, attempts: int) -> float:
        return min(self.max_delay, self.initial_delay * 2 ** max(0, attempts - 1))

    def _hold(self, partition: int, node: str, now: float) -> None:
        old = self.holds.get(partition)
        # a return to the same node soon after the last one backs off further; a long quiet spell
        # since then starts over
        recent = old is not None and old.node == node and now <= old.until + 10 * self.max_delay
        attempts = old.attempts + 1 if recent and old is not None else 1
        hold = _Hold(node, now + self._delay(attempts), attempts)
        if old is not None and old.node == node:  # the refusals counted under this map still count
            hold.refusals, hold.revision = old.refusals, old.revision
        self.holds[partition] = hold

    def _not_yet(self, partition: int, node: str, revision: int | None) -> bool:
        """A refusal by the node that the held map, as new as the node's or newer, names active."""
        return (self.map is not None and self.map.actives.get(partition) == node
                and (revision is None or revision <= self.revision))

    def _refused(self, partition: int, node: str, now: float) -> None:
        """Hold a "not yet" refusal back briefly, or like any return once the node refused it
        ``refusals_per_revision`` times under this map."""
        old = self.holds.get(partition)
        same = old is not None and old.node == node and old.revision == self.revision
        refusals = old.refusals + 1 if same and old is not None else 1
        if refusals > self.refusals_per_revision:
            self._hold(partition, node, now)
            self.holds[partition].refusals, self.holds[partition].revision = refusals, self.revision
            return
        # the dead node's doubling delay, but never past refusal_delay: the first retry comes as
        # soon as after any other move, the later ones at a steady, bounded pace
        delay = min(self._delay(refusals), self.refusal_delay)
        self.holds[partition] = _Hold(node, now + delay, 0, refusals, self.revision)

    def _close(self, conn_id: int) -> Close:
        conn = self.connections.pop(conn_id)
        for p in conn.partitions:
            del self.assigned[p]
        return Close(conn_id, conn.node, tuple(sorted(conn.partitions)))

    def _reload(self, now: float, delay: float) -> list[RouteAction]:
        at = now + delay
        if self.reload_at is not None and self.reload_at <= at:
            return []  # an earlier (or the same) reload is pending already
        self.reload_at = at
        return [Reload(delay)]

    def _reload_if_needed(self, now: float) -> list[RouteAction]:
        """After a stale map: read again (backing off) while a newer one is due or partitions wait."""
        if self.seen_revision > self.revision or self.waiting():
            self._reload_failures += 1
            return self._reload(now, self._delay(self._reload_failures))
        return []

    def _place(self, now: float) -> list[RouteAction]:
        view = self.map
        assert view is not None
        by_node: dict[str, list[int]] = {}
        newly_unserved: list[int] = []
        times: list[float] = []
        for p in self.partitions:
            if p in self.assigned or p in self.done:
                continue
            node, url = view.url_of(p)
            if node is None or url is None:
                if p not in self.unserved:
                    newly_unserved.append(p)
                self.unserved.add(p)
                continue
            self.unserved.discard(p)
            hold = self.holds.get(p)
            if hold is not None and hold.node == node and hold.until > now:
                times.append(min(hold.until, now + self.poll_delay))  # the map may move it sooner
                continue
            if hold is not None and hold.node != node:
                del self.holds[p]
            by_node.setdefault(node, []).append(p)
        actions: list[RouteAction] = []
        for node, parts in sorted(by_node.items()):
            conn_id = self._next_conn
            self._next_conn += 1
            url = view.urls[node]
            assert url is not None
            self.connections[conn_id] = _Connection(node, url, set(parts))
            for p in parts:
                self.assigned[p] = conn_id
            actions.append(Open(conn_id, node, url, tuple(parts)))
        if newly_unserved:
            why = ", ".join(f"{p}: " + ("no active node" if view.actives.get(p) is None
                                        else f"node {view.actives[p]} is down") for p in newly_unserved)
            actions.append(Unserved(tuple(newly_unserved), f"map revision {view.revision}: {why}"))
        if self.unserved:
            if self._unserved_since is None:
                self._unserved_since = now
            self._unserved_polls += 1
            delay = self._delay(self._unserved_polls)
            if now - self._unserved_since < self.unserved_poll_s:
                delay = min(delay, self.poll_delay)  # a failover may name a new active any moment
            times.append(now + delay)
        else:
            self._unserved_polls = 0
            self._unserved_since = None
        if self.seen_revision > self.revision:
            self._reload_failures += 1  # a node answered an older map than one heard of
            times.append(now + self._delay(self._reload_failures))
        if times:
            actions += self._reload(now, max(0.0, min(times) - now))
        return actions
