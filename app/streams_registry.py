"""The open stream connections, as ``GET /streams``, ``/status`` and ``/metrics`` see them.

The WebSocket stream endpoint registers one handle per connection on accept and
unregisters it on close.  A handle only has to describe itself (``to_status``);
it may also offer ``async shutdown()``, which the app awaits for every open
connection when the server stops (so streams end with ``shutting_down`` rather than
a dropped socket).  Everything here runs on the event loop: no locks.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class PartitionStreamStatus:
    partition: int
    #: Last seqno sent to the client on this partition (0 before the first item).
    last_sent_seqno: int
    #: high seqno of the partition minus ``last_sent_seqno`` when the status was taken.
    lag: int
    #: the partition's purge seqno at the stream's last snapshot (tombstones at or below it may be gone).
    purge_seqno: int = 0
    #: ``last_sent_seqno - purge_seqno``: how far the consumer is above the purge horizon.  Near or
    #: below 0, a consumer that disconnects now and resumes later is told to roll back to 0 (purged).
    purge_distance: int = 0


@dataclass(frozen=True, slots=True)
class ConnectionStatus:
    """One open stream connection as ``GET /streams`` shows it."""

    name: str
    remote: str
    codec: str
    partitions: list[PartitionStreamStatus] = field(default_factory=list)
    #: Bytes sent but not yet acknowledged by the client (its flow-control window use).
    bytes_buffered: int = 0
    barriers_pending: int = 0
    connected_at: float = 0.0
    id: int = 0
    #: flow-control window the consumer asked for (0 before hello).
    window_bytes: int = 0
    #: snapshots released because the consumer stopped making progress (cursor dropping).
    cursor_drops: int = 0
    #: rollbacks this connection was told to do.
    rollbacks: int = 0


@runtime_checkable
class StreamHandle(Protocol):
    def to_status(self) -> ConnectionStatus: ...


class StreamRegistry:
    """Open stream connections by id, in connection order."""

    def __init__(self) -> None:
        self._handles: dict[int, StreamHandle] = {}
        self._ids = itertools.count(1)
        self._index: dict[int, int] = {}  # id(handle) -> registry id
        self.total_registered = 0

    def register(self, handle: StreamHandle) -> int:
        """Add a connection; returns its registry id (shown as ``id`` in ``GET /streams``)."""
        stream_id = next(self._ids)
        self._handles[stream_id] = handle
        self._index[id(handle)] = stream_id
        self.total_registered += 1
        return stream_id

    def unregister(self, handle: StreamHandle) -> None:
        stream_id = self._index.pop(id(handle), None)
        if stream_id is not None:
            self._handles.pop(stream_id, None)

    def __len__(self) -> int:
        return len(self._handles)

    def __iter__(self) -> Iterator[StreamHandle]:
        return iter(list(self._handles.values()))

    def statuses(self) -> list[ConnectionStatus]:
        """Each connection's status, with the registry id filled in."""
        out: list[ConnectionStatus] = []
        for stream_id, handle in list(self._handles.items()):
            status = handle.to_status()
            if status.id != stream_id:
                status = dataclasses.replace(status, connected_at=status.connected_at or time.time(), id=stream_id)
            out.append(status)
        return out

    async def shutdown(self) -> None:
        """Ask every connection that supports it to end its streams (server stopping)."""
        for handle in list(self._handles.values()):
            stop = getattr(handle, "shutdown", None)
            if stop is None:
                continue
            result = stop()
            if inspect.isawaitable(result):
                await result
