"""The interface every measured system implements: ours and each peer alike.

A system has two halves that run in different processes, as they would for a user:

* in the suite's process, :class:`System` installs and starts the server, empties it between
  workloads and hands out a :class:`Writer` whose ``write`` returns when the system acknowledges
  the batch with its stated durability (that moment is the "write ack" of the latency figures);
* in a consumer process (:mod:`bench.suite.child`), the module named by :attr:`System.stream_module`
  provides ``open_stream(conn, start, ident)``: an async iterator that first yields ``[]`` once it
  is subscribed (so writers start only after every reader is in place), then lists of the
  documents as received (bytes or str, the 200-byte JSON of :mod:`bench.suite.docs`).

``start`` is ``"beginning"`` (backfill: everything stored) or ``"now"`` (tail: only what is written
after subscribing). ``conn`` is the JSON-able dict returned by :meth:`System.consumer_conn`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from bench.suite.install import InstallLog
from bench.suite.procs import ProcessGroup

Start = Literal["beginning", "now"]
Doc = tuple[str, bytes]


class Writer(Protocol):
    async def write(self, docs: Sequence[Doc]) -> Sequence[int] | None:
        """Store ``docs``; return when the system acknowledges them with its stated durability.

        A system whose client sees each document's ack separately (JetStream PubAcks) returns
        the ``time.monotonic_ns()`` of each; ``None`` means the batch was acknowledged as one.
        """

    async def close(self) -> None: ...


class StreamFactory(Protocol):
    def __call__(self, conn: dict[str, Any], start: Start, ident: int) -> AsyncIterator[list[bytes | str]]: ...


class System(ABC):
    """One system under test. Subclasses set the class attributes and implement the methods."""

    name: str  # short id used in the table and JSON: "upr", "redis", "nats", "postgres"
    label: str  # what a reader recognises: "Redis Streams"
    stream_module: str  # module with open_stream(), imported by the consumer process
    durability: str  # one sentence: what an ack means for this system as configured here
    method: dict[str, str] = {}  # workload -> how this system does it ("pipelined XADD x1000")
    only: tuple[str, ...] | None = None  # the workloads this system is measured on (None: all)

    @abstractmethod
    def prepare(self, log: InstallLog) -> dict[str, str]:
        """Install what is missing; return versions; raise :class:`~bench.suite.install.Skip`."""

    @abstractmethod
    async def start(self, procs: ProcessGroup, workdir: Path) -> None:
        """Start the server(s) through ``procs`` on 127.0.0.1 with ephemeral ports."""

    @abstractmethod
    async def reset(self, *, empty: bool = True) -> None:
        """Empty the feed (ingest and backfill need exactly their own documents).

        ``empty=False`` (tail, fan-out: readers start at "now") lets a system whose emptying is
        expensive (upr: a server restart) keep what is stored; cheap ones empty anyway."""

    @abstractmethod
    async def writer(self) -> Writer: ...

    @abstractmethod
    def consumer_conn(self) -> dict[str, Any]: ...

    async def stop(self) -> None:
        """Close clients held by the system; the ProcessGroup stops the processes."""
