"""The asyncio consumer: the public API of a resumable change-feed consumer.

Typical use::

    async with Consumer("http://127.0.0.1:8000", token=tok, name="indexer",
                        state=FileStateStore("./indexer-state")) as consumer:
        async for event in consumer:
            if isinstance(event, Mutation): index.put(event.key, event.value)
            elif isinstance(event, Deletion): index.delete(event.key)
            elif isinstance(event, PartitionReset): index.drop_partition(event.partition)

The consumer is a thin adapter: ``engine.protocol.client.session.ClientSession`` makes every protocol
decision; ``clients.receive`` runs the stream loop (what counts as processed, and when),
``clients.repair`` carries out rollbacks, ``clients.connection`` moves the bytes.  Breaking out of
the loop leaves the last yielded event unprocessed unless ``commit()`` was called for it: it will
come again (at-least-once).

A cluster: ``server`` may name several nodes (a list, or "URL,URL"; any will do).  When the node
that answers ``GET /cluster`` holds a partition map, the consumer opens one stream connection
per node for the partitions it is active for and follows the map as partitions move
(``clients.cluster``); positions stay per partition, whichever node served them.  Otherwise
(404: a single node) it is the one-connection consumer described here.

Batch fast path: ``async for x in consumer.batches()`` yields whole ``ItemBatch`` objects (columns:
``seqnos``, ``keys``, ``values``...; ``deleted[i]`` 0/1) instead of one event per item, and every other
event as usual; a batch counts as processed when the next one is requested.

``visibility="persisted"`` (or ``"majority"`` on a cluster) asks the server for only what cannot
be taken back: no rollback after an unclean restart (or a failover), at the cost of waiting for
the flush (or the replicas); the default ``"memory"`` gets every write at once.
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from engine.core.types import FailoverEntry
from engine.protocol import messages as M
from engine.protocol.client.acks import AckTracker
from engine.protocol.client.actions import RollbackPolicy, SeekAction, StartMode
from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.session import DEFAULT_WINDOW, ClientSession
from engine.protocol.frames import ItemBatch

from .backoff import Backoff
from .cluster import ClusterStreams, NodeLost, read_cluster_map, split_servers
from .connection import StreamConnection, stream_url
from .errors import AuthFailed, ConnectionFailed, UsageError
from .events import BarrierReached, Event, events_of
from .http import AsyncHttpApi, default_server, default_token
from .receive import ReceiveLoop
from .ring import RollbackRing
from .state import FileStateStore, MemoryStateStore, StateStore

if TYPE_CHECKING:
    from .cluster import _StateView

__all__ = ["Consumer", "Handler", "NodeStream", "stream_url"]

Handler = Callable[[Any], "Awaitable[None] | None"]

log = logging.getLogger("upr.client")


class Consumer(ReceiveLoop):
    """One WebSocket stream over a set of partitions; see the module docstring."""

    #: ask ``GET /cluster`` before streaming (node streams of a cluster consumer do not)
    _probe = True

    def __init__(
        self,
        server: str | Sequence[str] | None = None,
        *,
        token: str | None = None,
        name: str = "upr-client",
        partitions: Sequence[int] | None = None,
        start: str | StartMode = StartMode.SAVED,
        state: StateStore | str | os.PathLike[str] | None = None,
        ring_size: int = 100_000,
        ring: RollbackRing | None = None,
        until_now: bool = False,
        offsets: Mapping[int, StreamOffset] | None = None,
        end_seqnos: Mapping[int, int] | None = None,
        codec: str = "binary",
        window_bytes: int = DEFAULT_WINDOW,
        ack_ratio: float = 0.2,
        commit_interval: float = 1.0,
        max_reconnect_attempts: int | None = None,
        backoff: Backoff | None = None,
        open_timeout: float = 10.0,
        ping_interval: float | None = 20.0,
        max_frame_bytes: int = 256 << 20,
        correction_concurrency: int = 16,
        max_corrections: int = 10_000,
        commit: str = "item",
        handler: Handler | None = None,
        on_rollback: str | RollbackPolicy = RollbackPolicy.REPAIR,
        bundle: bool = True,
        visibility: str = "memory",
        frames: str = "messages",
    ) -> None:
        self.seeds = split_servers(server or default_server())  # a bad address: UsageError now
        self.server = self.seeds[0]
        self.url = stream_url(self.server)
        self.token = token if token is not None else default_token()
        self.name = name
        self.codec = M.Codec(codec)
        self.window_bytes = window_bytes
        #: accept bundle frames (several server messages in one WebSocket message): fewer
        #: messages for the server to send, the same messages for this loop to process
        self.bundle = bundle
        try:
            #: ``packed``: a pass's markers and batches may come as one packed pass, decoded in one
            #: call (hello ``frames``; needs the binary codec and bundles)
            self.frames = M.Frames(frames)
        except ValueError:
            raise UsageError(f"frames must be one of {', '.join(M.Frames)}, got {frames!r}", field="frames") from None
        if self.frames is M.Frames.PACKED and (self.codec is not M.Codec.BINARY or not bundle):
            raise UsageError("frames 'packed' needs codec 'binary' and bundle=True", field="frames")
        try:
            #: which writes the server may send (hello ``visibility``; see the module docstring)
            self.visibility = M.Visibility(visibility)
        except ValueError:
            raise UsageError(f"visibility must be one of {', '.join(M.Visibility)}, got {visibility!r}",
                             field="visibility") from None
        if commit not in ("item", "snapshot"):
            raise UsageError(f"commit must be 'item' or 'snapshot', got {commit!r}", field="commit")
        if isinstance(state, (str, os.PathLike)):
            state = FileStateStore(state)
        self.state_store: StateStore = state if state is not None else MemoryStateStore()
        acquire = getattr(self.state_store, "acquire", None)
        if acquire is not None:
            acquire()  # before the ring file in the same directory is touched
        try:
            saved = self.state_store.load() if StartMode(start) is StartMode.SAVED else None
            if ring is None and ring_size > 0:
                ring = RollbackRing(ring_size, self.state_store.ring_directory)
            self.session = ClientSession(partitions=partitions, start=start, saved=saved, offsets=offsets,
                                         end_seqnos=end_seqnos, until_now=until_now,
                                         ring=ring.model if ring is not None else None,
                                         max_corrections=max_corrections, on_rollback=on_rollback,
                                         window_bytes=window_bytes, ack_ratio=ack_ratio)
        except BaseException:
            if ring is not None:
                ring.close()
            release = getattr(self.state_store, "close", None)
            if release is not None:
                release()
            raise
        self.ring = ring
        # what a node stream of a cluster needs to be this consumer on one node (clients.cluster)
        self._options: dict[str, Any] = dict(
            token=self.token, name=name, codec=codec, window_bytes=window_bytes, ack_ratio=ack_ratio,
            commit_interval=commit_interval, max_reconnect_attempts=max_reconnect_attempts, backoff=backoff,
            open_timeout=open_timeout, ping_interval=ping_interval, max_frame_bytes=max_frame_bytes,
            correction_concurrency=correction_concurrency, max_corrections=max_corrections, commit=commit,
            on_rollback=on_rollback, bundle=bundle, ring_size=0, visibility=self.visibility.value,
            frames=self.frames.value)
        self._probe_cluster = self._probe
        #: the discovery under way or done (``_discover_once``), shared by every caller
        self._discovery: asyncio.Future[None] | None = None
        self._cluster: ClusterStreams | None = None
        #: "item": save the last processed item (a partial snapshot is saved as such); "snapshot":
        #: save only whole processed snapshots, for handlers that apply a snapshot at its end.
        self.commit_mode = commit
        self.commit_interval = commit_interval
        self.max_reconnect_attempts = max_reconnect_attempts
        self.backoff = backoff or Backoff()
        self.open_timeout = open_timeout
        self.ping_interval = ping_interval
        self.max_frame_bytes = max_frame_bytes
        self.correction_concurrency = correction_concurrency
        self.handler = handler
        self._http: AsyncHttpApi | None = None
        self._conn: StreamConnection | None = None
        #: session actions waiting for the stream loop (repairs found at the handshake)
        self._pending: deque[Any] = deque()
        self._gen: AsyncIterator[Any] | None = None
        self._barrier_drives = False
        self._gen_kind: str | None = None
        self._iterating = False
        self._closed = False
        self._done = False
        self._last_save = time.monotonic()
        self._dirty = False
        self._idle_save: asyncio.TimerHandle | None = None
        self._cookies = itertools.count(1)
        self._barriers: dict[str, asyncio.Future[BarrierReached]] = {}
        #: barrier sends in flight, held until done: the loop keeps only a weak reference to a task
        self._barrier_sends: set[asyncio.Future[None]] = set()
        # seeks waiting for the stream loop: partitions to request, or a reconnect for open streams
        self._seek_requests: set[int] = set()
        self._seek_reconnect = False
        self._wake: asyncio.Task[None] | None = None
        # the batch being handed over item by item: commit() applies it up to the current item
        self._b_pos: Any = None
        self._b_seqnos: Sequence[int] = ()
        self._b_done = 0
        self._b_i = -1
        self._b_events: Any = None  # its per-item iterator, drained by a seek of its partition
        self._b_cut = False
        # counters
        self.reconnects = 0
        self.items_processed = 0
        self.corrections = 0

    @property
    def http(self) -> AsyncHttpApi:
        """The HTTP client for repairs, made when first needed: building one loads the TLS trust
        store, which blocks the event loop for tens of milliseconds (more on a busy machine), and a
        cluster consumer builds a node stream for every partition move."""
        if self._http is None:
            self._http = AsyncHttpApi(self.server, self.token)
        return self._http

    # ------------------------------------------------------------------ public API
    async def __aenter__(self) -> "Consumer":
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the stream now (otherwise the first iteration does): errors surface here.

        With a cluster, this reads the map; the node connections open with the first iteration."""
        await self._discover_once()
        if self._cluster is None and self._conn is None and not self._done:
            await self._open()

    async def _discover_once(self) -> None:
        """Find out whether the seeds are a cluster, once.  A caller arriving while another
        caller's discovery is under way (``barrier()`` while the iterating task reads the map)
        waits for its outcome: going on at once, it would find no cluster yet and open a
        single-node connection beside the cluster's, and a barrier sent there never returns."""
        if self._discovery is None:
            if not self._probe_cluster:
                return
            self._discovery = asyncio.ensure_future(self._discover())
            await self._discovery  # the first caller gets its errors
        elif not self._discovery.done():
            await asyncio.wait([self._discovery])  # another caller's: its outcome, not its errors

    async def _discover(self) -> None:
        """Is the server a cluster?  ``GET /cluster`` from the first seed that answers: a map makes
        this a cluster consumer; 404 (or no answer: the single-node connect reports it) does not."""
        self._probe_cluster = False
        client = httpx.AsyncClient()
        try:
            view, url = await read_cluster_map(client, self.seeds, self.token, self.open_timeout)
        except ConnectionFailed:
            await client.aclose()
            return
        except BaseException:
            await client.aclose()
            raise
        if view is None:
            await client.aclose()
            if url != self.server:  # a single node, named after others that did not answer
                self.server, self.url = url, stream_url(url)
                if self._http is not None:
                    await self._http.aclose()
                    self._http = None
            return
        log.info("consumer %s: %s is in a cluster (map revision %d, %d partitions): following the map",
                 self.name, url, view.revision, view.num_partitions)
        self._cluster = ClusterStreams(self, self.seeds, view, url, client, NodeStream)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterator("events")

    def batches(self) -> AsyncIterator[ItemBatch | Event]:
        """Whole item batches instead of per-item events (throughput-critical consumers)."""
        return self._iterator("batches")

    async def run(self, handler: Handler | None = None) -> None:
        """Hand every event to ``handler`` (sync or async) until the streams end or ``close()``.

        Items are handed over straight from each decoded batch, without a generator switch per
        item (the cheapest way to consume per item); an event counts as processed once the
        handler returned (or its awaitable finished)."""
        handler = handler or self.handler
        if handler is None:
            raise UsageError("run() needs a handler")
        isawaitable = inspect.isawaitable
        await self._discover_once()
        if self._cluster is not None:  # per event: commit() must see which item is being handled
            async for event in self._iterator("events"):
                result = handler(event)
                if isawaitable(result):
                    await result
            return
        async for x in self._iterator("batches"):
            if type(x) is not ItemBatch:
                result = handler(x)
                if isawaitable(result):
                    await result
                continue
            i = 0
            self._b_events = events = events_of(x)
            for event in events:
                self._b_i = i
                result = handler(event)
                if result is not None and isawaitable(result):
                    await result
                i += 1

    def request_barrier(self) -> str:
        """Send a barrier cookie now and return it; a ``BarrierReached`` with it comes later."""
        cookie = f"c{next(self._cookies)}"
        self._barriers[cookie] = asyncio.get_running_loop().create_future()
        if self._cluster is not None:
            self._cluster.request_barrier(cookie)
        elif self._conn is not None:
            sending = asyncio.ensure_future(self._send_quiet(M.Barrier(cookie)))
            self._barrier_sends.add(sending)
            sending.add_done_callback(self._barrier_sends.discard)
        return cookie

    def _barrier_done(self, event: BarrierReached) -> None:
        """A cluster barrier's merged event was processed (``clients.cluster``)."""
        fut = self._barriers.pop(event.cookie, None)
        if fut is not None and not fut.done():
            fut.set_result(event)

    async def barrier(self, timeout: float | None = None) -> BarrierReached:
        """Return once the consumer has *processed* a consistent point of every partition.

        Every mutation acknowledged to a writer before this call is processed before it returns.
        Call it from another task than the one iterating, or with no one iterating and a
        ``handler`` given to the constructor (then this call drives the stream itself)."""
        if self._done or self._closed:
            raise UsageError("barrier() after the streams ended or the consumer was closed")
        if self._conn is None:
            await self.connect()
        cookie = self.request_barrier()
        fut = self._barriers[cookie]
        if self._iterating and not self._barrier_drives:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(fut)
        if self.handler is None:
            raise UsageError("barrier() with nobody consuming: iterate the consumer in another task, "
                             "or pass handler= so that barrier() can drive the stream")

        # from now on barrier() drives: the iteration it leaves suspended between calls is its own,
        # not another task's to wait for
        self._barrier_drives = True

        async def pump() -> BarrierReached:
            async for event in self:
                result = self.handler(event)  # type: ignore[misc]
                if inspect.isawaitable(result):
                    await result
                if type(event) is BarrierReached and event.cookie == cookie:
                    self._barriers.pop(cookie, None)
                    return event  # the handler returned: processed
            raise ConnectionFailed("the stream ended before the barrier came back")

        async with asyncio.timeout(timeout):
            return await pump()

    async def commit(self) -> None:
        """Save the processed position of every partition now (including the event being handled)."""
        if self._cluster is not None:
            await self._cluster.commit()
            return
        self._apply_batch_progress(self._b_i + 1)
        self._save()

    def committed(self) -> dict[int, StreamOffset]:
        """Current processed position per partition (what a restart would resume from after commit)."""
        if self._cluster is not None:
            return self._cluster.committed()
        return self.session.committed()

    def position(self, partition: int) -> StreamOffset:
        if self._cluster is not None:
            return self._cluster.position(partition)
        return self.session.positions[partition].offset()

    def failover_log(self, partition: int) -> tuple[FailoverEntry, ...]:
        """The failover log ``partition`` streams with (in a cluster: its current node's)."""
        if self._cluster is not None:
            return self._cluster.failover_log(partition)
        return self.session.positions[partition].failover_log

    async def partition_info(self, partition: int) -> dict[str, Any]:
        """``GET /partitions/{p}`` from the node that streams ``partition`` (its failover log,
        high seqno): the history a rollback point or a seek offset must be read from."""
        if self._cluster is not None:
            return await self._cluster.partition_info(partition)
        return await self.http.partition(partition)

    def seek(self, partition: int, offset: StreamOffset) -> None:
        """Restart ``partition`` from ``offset`` (java-dcp-client's ``rollbackAndRestartStream``).

        Typical use is with ``on_rollback="report"``: on a ``Rollback`` event the handler cuts its
        own copy back to a position it holds exactly and seeks there; called while the event is
        being handled, the partition's next stream starts at ``offset`` instead of at the rollback
        point.  Called at other times: before the stream opened it replaces the start offset; for
        a partition whose bounded stream ended, the partition is streamed again; for a partition
        that is streaming, the consumer reconnects (other partitions resume from their processed
        positions) so that no item of the old stream is handed over after this call returns
        (the event being handled when it is called counts as processed); called from another task
        while the stream waits for frames, it closes the socket to reconnect at once.
        Nothing above ``offset`` counts as applied any more (the ring forgets it)."""
        if self._closed or self._done:
            raise UsageError("seek() after the streams ended or the consumer was closed", partition=partition)
        if self._cluster is not None:
            self._cluster.seek(partition, offset)
            return
        action = self.session.seek(partition, offset)
        if action is SeekAction.REQUEST:
            self._seek_requests.add(partition)
        elif action is SeekAction.RECONNECT:
            self._seek_reconnect = True
            if self._b_pos is not None and self._b_pos is self.session.positions.get(partition):
                # the rest of the batch being handed over belongs to the old stream: drop it (a
                # C-level drain of its iterator ends the item loop; nothing is counted processed)
                self._b_cut = True
                if self._b_events is not None:
                    deque(self._b_events, maxlen=0)
            elif self._conn is not None and self._conn.reading:
                # called from another task while the stream waits for a frame that may never come
                # (idle partitions): closing the socket wakes it, and it reconnects at once
                self._wake = asyncio.get_running_loop().create_task(self._conn.close())

    @property
    def rollbacks(self) -> int:
        if self._cluster is not None:
            return self._cluster.total("rollbacks")
        return self.session.rollbacks

    @property
    def resets(self) -> int:
        if self._cluster is not None:
            return self._cluster.total("resets")
        return self.session.resets

    @property
    def acks(self) -> AckTracker:
        """Flow-control acknowledgements (``acked_total``: bytes acknowledged so far; in a cluster,
        a snapshot of the sum over every node connection)."""
        if self._cluster is not None:
            acks = AckTracker(self.window_bytes, self.session.acks.threshold / self.window_bytes)
            acks.acked_total = self._cluster.total("acked")
            return acks
        return self.session.acks

    async def close(self) -> None:
        """Save processed state, close the stream, the ring and the HTTP client."""
        if self._closed:
            return
        self._closed = True
        if self._idle_save is not None:
            self._idle_save.cancel()
            self._idle_save = None
        gen, self._gen = self._gen, None
        if gen is not None:
            try:
                await gen.aclose()  # type: ignore[attr-defined]
            except Exception:  # pragma: no cover - closing a broken generator
                pass
        try:
            if self._cluster is not None:
                await self._cluster.close()
                await self._cluster.client.aclose()
            elif self.session.positions:
                self._save()
        finally:
            if self._conn is not None:
                await self._conn.close()
                self._conn = None
            if self.ring is not None:
                self.ring.close()
            close_store = getattr(self.state_store, "close", None)
            if close_store is not None:
                close_store()
            if self._http is not None:
                await self._http.aclose()
            for fut in self._barriers.values():
                if not fut.done():
                    fut.set_exception(ConnectionFailed("consumer closed before the barrier came back"))
                    fut.exception()  # awaiters still get it; nobody waiting is not an error

    # ------------------------------------------------------------------ the stream
    def _iterator(self, kind: str) -> AsyncIterator[Any]:
        if self._gen is not None:
            if self._gen_kind != kind:
                raise UsageError("a consumer is iterated one way only: events or batches(), not both")
            return self._gen
        if self._closed:
            raise UsageError("the consumer is closed")
        self._gen_kind = kind
        self._gen = self._stream(per_item=kind == "events")
        return self._gen


class NodeStream(Consumer):
    """One node's connection of a cluster consumer (``clients.cluster``): a ``Consumer`` whose
    session follows the map (a partition not active here comes back as ``PartitionMoved``) and
    whose lost connection is the router's business (``NodeLost``), not a reconnect to this node."""

    _probe = False

    def __init__(self, conn: int, node: str, states: _StateView, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, state=states, **kwargs)
        self.session.follow_map = True
        self.conn_id = conn
        self.node = node
        self.view = states
        self._seek_reopen = False

    async def _open(self) -> None:
        try:
            await super()._open()
        except AuthFailed:
            raise
        except ConnectionFailed as exc:
            raise NodeLost(str(exc)) from None

    def seek(self, partition: int, offset: StreamOffset) -> None:
        super().seek(partition, offset)
        if self._seek_reconnect:
            self._seek_reopen = True  # a new stream on this same node, not a lost node

    async def _reconnect(self, why: str) -> None:
        if self._seek_reopen:  # a seek of a streaming partition: hello again here, once
            self._seek_reopen = False
            self.session.connection_lost()
            self._pending.clear()
            if self._conn is not None:
                conn, self._conn = self._conn, None
                await conn.close()
            await self._open()  # NodeLost if this node is gone meanwhile: then the map decides
            self.reconnects += 1
            return
        self.session.connection_lost()
        raise NodeLost(why)

    def _save(self) -> None:
        # into the shared per-partition state, which syncs the shared ring before it writes
        self.state_store.save(self.session.state(whole_snapshots=self.commit_mode == "snapshot"))
        self._last_save = time.monotonic()
        self._dirty = False

    async def close(self) -> None:
        self.ring = None  # shared by every node stream: the cluster consumer closes it
        await super().close()
