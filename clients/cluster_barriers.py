"""A cluster barrier: one cookie on every node connection, the nodes' answers merged into one cut.

A node's barrier covers the partitions streaming there when its cookie arrives; a cluster's is
complete once every node stream holding partitions returned it and no wanted partition waits for
a node, and the merged vector then covers every write acknowledged anywhere before the request.
Mixed into ``clients.cluster.ClusterStreams``, whose node streams (``live()``), router and
``barriers`` / ``_sent`` bookkeeping it uses.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from engine.protocol import messages as M
from engine.protocol.client.routing import Router

from .events import BarrierReached

__all__ = ["ClusterBarriers"]


def _all_streaming(s: Any) -> bool:
    """Every unfinished partition of node stream ``s`` has its stream requested (none waits for a
    rollback's or a repair's new request)."""
    session = s.session
    return all(p in session.open or p in session.finished for p in s.view.partitions)


class ClusterBarriers:
    """The barrier half of ``ClusterStreams`` (see the module docstring)."""

    router: Router
    #: pending barrier cookies: node stream -> the seqnos it returned (see ``request_barrier``)
    barriers: dict[str, dict[Any, dict[int, int]]]
    #: cookies sent on each node stream
    _sent: dict[Any, set[str]]
    #: cookie sends not finished yet
    _sending: set[asyncio.Future[None]]

    if TYPE_CHECKING:
        def live(self) -> list[Any]: ...

    def request_barrier(self, cookie: str) -> None:
        """A cluster barrier: ``cookie`` goes on every node connection (and on every connection
        that opens while it is pending, for partitions that moved); it completes once every node
        stream holding partitions returned it and no wanted partition waits for a node.  Each node's
        barrier covers every write acknowledged there before the cookie arrived, so the merged
        vector is a cut of the whole cluster covering every write acknowledged before the request."""
        self.barriers[cookie] = {}
        self._send_barriers()

    def _send_barriers(self) -> bool:
        """Send pending cookies on node streams that are open; True if some stream is not open yet."""
        unopened = False
        for s in self.live():
            if s._conn is None or not _all_streaming(s):
                # its handshake is not done, or a partition of it is between a rollback answer and
                # its new request: send after (a node's barrier covers only partitions streaming
                # when the cookie arrives, so the new request must go first)
                unopened = True
                continue
            sent = self._sent.setdefault(s, set())
            for cookie in self.barriers:
                if cookie not in sent:
                    sent.add(cookie)
                    # held until sent: the loop keeps only a weak reference to a task
                    sending = asyncio.ensure_future(s._send_quiet(M.Barrier(cookie)))
                    self._sending.add(sending)
                    sending.add_done_callback(self._sending.discard)
        return unopened

    def _barrier_returned(self, s: Any, event: BarrierReached) -> BarrierReached | None:
        returned = self.barriers.get(event.cookie)
        if returned is None:
            return None
        held = {p for p in s.view.partitions if p not in s.session.finished}
        if not held <= event.seqnos.keys():
            # some partition was not streaming there when the cookie arrived (its request was
            # answered with a rollback meanwhile): that node's cut does not cover it; ask again
            self._sent.get(s, set()).discard(event.cookie)
            return None
        returned[s] = {p: q for p, q in event.seqnos.items() if p in s.view.partitions}
        return self._completed(event.cookie)

    def _completed(self, cookie: str) -> BarrierReached | None:
        returned = self.barriers[cookie]
        if self.router.map is None or self.router.waiting():
            return None
        holders = [s for s in self.live() if s.view.partitions]
        if not all(s in returned for s in holders):
            return None
        del self.barriers[cookie]
        seqnos: dict[int, int] = {}
        for s in holders:
            seqnos.update(returned[s])
        return BarrierReached(cookie, dict(sorted(seqnos.items())))

    def _reached(self) -> BarrierReached | None:
        """A pending barrier that completed because streams closed or partitions moved."""
        for cookie in list(self.barriers):
            reached = self._completed(cookie)
            if reached is not None:
                return reached
        return None
