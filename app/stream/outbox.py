"""The outgoing side of one stream connection: every frame the server sends goes through here.

Theory of operation
-------------------
Two producers share one socket: the connection's reader queues control replies (stream responses,
errors, barrier releases, stream ends) with ``queue``, and the sender emits the stream's markers
and item batches with ``emit``.  ``flush_control`` sends the queued replies; the sender calls it
between items, so a reply never waits behind a whole pass, and a reply never overtakes items
emitted before it (it joins the pending bundle after them).

Every frame is counted against the consumer's flow-control window as it is handed over
(``ServerSession.sent``); bundled parts are counted when added, so ``can_send`` sees them.
``send_since`` is when the send in progress began (None between sends): a send the socket does
not take is a consumer that does not drain, which cursor dropping acts on.

With ``raw`` (``app.stream.rawframes``) a message is framed here and written to the transport
directly whenever the transport takes writes, and a shared pass's parts are written as they are,
uncopied; otherwise (the transport paused, a server other than uvicorn's sans-I/O protocol) it
goes through ASGI, which waits for the transport to drain.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from app.stream.rawframes import RawFrames
from engine.protocol import messages as M
from engine.protocol.binary_header import HEADER
from engine.protocol.bundle import OVERHEAD, PART, PART_BINARY, Bundler, bundle_pieces, encode_parts
from engine.protocol.packed import packed_header

__all__ = ["Outbox", "control_text"]


class Outbox:
    def __init__(self, ws: Any, session: Any, *, bundle_bytes: int, on_bytes: Callable[[int], None],
                 on_delivery: Callable[[float], None], raw: RawFrames | None = None) -> None:
        self.ws = ws
        self._raw = raw
        self.session = session
        self.bytes_sent = 0
        #: when the send in progress began; None while no send is in progress
        self.send_since: float | None = None
        self._bundle_bytes = bundle_bytes
        self._on_bytes = on_bytes
        self._on_delivery = on_delivery
        self._control: deque[Any] = deque()
        self._drained = asyncio.Event()
        #: messages of the pass not yet handed to the socket (hello bundle: true), see ``emit``
        self._bundler: Bundler | None = None
        self._bundled_notified: list[float] = []

    # ------------------------------------------------------------------ control replies
    def queue(self, msg: Any) -> None:
        """Queue a control message for the next ``flush_control``."""
        self._control.append(msg)

    @property
    def queued(self) -> int:
        return len(self._control)

    async def wait_drained(self) -> None:
        """Wait until the next ``flush_control`` (a reader that queued too much waits here)."""
        self._drained.clear()
        await self._drained.wait()

    async def flush_control(self) -> None:
        """Send the queued control messages.  Bundling, they join the pending bundle, after the
        items before them (a cookie or stream end never overtakes those), and it goes out now:
        a pass's last batches and its ``cycle_complete`` travel as one message."""
        if self._control:
            if self._bundling() is not None:
                while self._control:
                    await self.emit(control_text(self._control.popleft()))
                await self.flush_bundle()
            else:
                while self._control:
                    await self.transmit(control_text(self._control.popleft()))
        self._drained.set()

    # ------------------------------------------------------------------ markers and batches
    async def emit(self, data: str | bytes) -> None:
        """Send a marker or batch: at once, or (hello ``bundle: true``) into the pass's bundle.

        WHY: each WebSocket message costs about as much on the loop whatever its size, and a
        tail pass sends a marker and a batch per partition per consumer; with 50 consumers that,
        not the items, was the server's limit (fan-out figures in docs/benchmarks.md).  The
        bundle goes out when the next part does not fit, before any control message, before
        waiting for a reader thread or for credit, and at the end of the pass (``flush_bundle``)."""
        bundler = self._bundling()
        if bundler is None:
            await self.transmit(data)
            return
        size = len(data)
        if not bundler.fits(size):
            await self.flush_bundle()
        bundler.add(data)
        self.session.sent(size)

    def bundle_takes(self, count: int, size: int) -> bool:
        """Whether ``count`` messages of ``size`` bytes in all can join the pending bundle now,
        with no send in between (``emit_now``); False when not bundling."""
        bundler = self._bundling()
        return bundler is not None and bundler.fits_all(count, size)

    def emit_now(self, data: str | bytes) -> None:
        """``emit`` without suspending, for a message ``bundle_takes`` said the bundle takes."""
        bundler = self._bundler
        assert bundler is not None
        bundler.add(data)
        self.session.sent(len(data))

    @property
    def bundle_pending(self) -> bool:
        """Parts wait in the bundle (the consumer cannot acknowledge them before they go out)."""
        return self._bundler is not None and len(self._bundler) > 0

    def delivered(self, notified_at: float) -> None:
        """A batch carrying a change notified at ``notified_at`` was emitted: observed now, or
        when its bundle is sent."""
        if self.bundle_pending:
            self._bundled_notified.append(notified_at)
        else:
            self._on_delivery(time.monotonic() - notified_at)

    async def flush_bundle(self, min_bytes: int = 0) -> None:
        """Send the pending bundle, if it holds at least ``min_bytes``."""
        bundler = self._bundler
        if bundler is None or not len(bundler) or bundler.pending_bytes < min_bytes:
            return
        counted = bundler.pending_bytes
        data = bundler.flush()
        assert data is not None
        notified, self._bundled_notified = self._bundled_notified, []
        await self.transmit(data, counted)
        now = time.monotonic()
        for t in notified:
            self._on_delivery(now - t)

    async def send_pass(self, encoded: list[bytes], count: int, notified: list[float], packed: bool = False) -> None:
        """Send a shared pass (``engine.protocol.shared_pass``) as one bundle: ``count`` parts
        laid out in ``encoded`` (shared with other connections), then the queued control
        messages (the pass's ``cycle_complete``, barrier releases).  The caller made sure the
        window has room and nothing is pending in the bundle.  ``notified``: when the changes it
        delivers were notified (observed once it is sent).  ``packed``: ``encoded`` are
        ``count`` packed-pass sections (``engine.protocol.packed``), sent as one packed pass."""
        controls = [control_text(m) for m in self._control]
        if packed:
            parts, size, fitted = _packed_pieces(encoded, count, controls, self._bundle_bytes)
            if fitted:
                self._control.clear()
        else:
            size = HEADER.size + sum(map(len, encoded))
            tail = encode_parts(controls) if controls else b""
            if controls and size + len(tail) <= self._bundle_bytes:
                self._control.clear()
                encoded, count = [*encoded, tail], count + len(controls)
                size += len(tail)
            parts = bundle_pieces(count, *encoded)
        raw = self._raw
        if raw is not None and raw.ready():
            raw.write_parts(parts, size)  # the shared parts go to the socket as they are
            self._sent(size, 0)
        else:
            await self.transmit(b"".join(parts))
        await self.flush_control()  # what did not fit (or was queued meanwhile) follows
        self._observe(notified)

    @property
    def writes_now(self) -> bool:
        """Whether ``send_pass_now`` may be used: messages go straight to a transport that takes them."""
        raw = self._raw
        return raw is not None and raw.ready()

    def send_pass_now(self, encoded: list[bytes], count: int, notified: list[float], packed: bool = False) -> None:
        """``send_pass`` without suspending, for a caller on the loop that is not the sender task
        (``writes_now`` must hold): the parts and the queued control messages that fit go out in
        one message; control messages that do not fit stay queued (the caller wakes the sender).
        Nothing is written when there is neither a part nor a control message."""
        controls = [control_text(m) for m in self._control]
        if packed and count:
            parts, size, fitted = _packed_pieces(encoded, count, controls, self._bundle_bytes)
            if fitted:
                self._control.clear()
            assert self._raw is not None
            self._raw.write_parts(parts, size)
            self._sent(size, 0)
            if not self._control:
                self._drained.set()
            self._observe(notified)
            return
        size = HEADER.size + sum(map(len, encoded))
        if controls:
            tail = encode_parts(controls)
            if size + len(tail) <= self._bundle_bytes:
                self._control.clear()
                encoded, count = [*encoded, tail], count + len(controls)
                size += len(tail)
        if count:
            assert self._raw is not None
            self._raw.write_parts(bundle_pieces(count, *encoded), size)
            self._sent(size, 0)
        if not self._control:
            self._drained.set()
        self._observe(notified)

    def _observe(self, notified: list[float]) -> None:
        if notified:
            now = time.monotonic()
            for t in notified:
                self._on_delivery(now - t)

    @property
    def packing(self) -> bool:
        """Whether the client accepts packed passes (hello ``frames: packed``)."""
        hello = self.session.hello
        return hello is not None and hello.frames is M.Frames.PACKED

    @property
    def bundling(self) -> bool:
        """Whether the client accepts bundles (hello ``bundle: true``)."""
        return self._bundling() is not None

    def _bundling(self) -> Bundler | None:
        """The pass's bundler when the client said ``bundle: true`` in hello (made on first use),
        else None: the one place that decides whether messages are bundled."""
        if self._bundler is None:
            hello = self.session.hello
            if hello is not None and hello.bundle:
                self._bundler = Bundler(self._bundle_bytes)
        return self._bundler

    # ------------------------------------------------------------------ the socket
    async def transmit(self, data: str | bytes, counted: int = 0) -> None:
        """Send one WebSocket message; ``counted`` of its bytes were already counted against the
        window (bundled parts are counted as they are added)."""
        raw = self._raw
        if raw is not None and raw.ready():
            raw.write(data)
        else:
            self.send_since = time.monotonic()
            if isinstance(data, str):
                await self.ws.send_text(data)  # pure ASCII: len(text) is the byte count acknowledged
            else:
                await self.ws.send_bytes(data)
            self.send_since = None
        self._sent(len(data), counted)

    def _sent(self, size: int, counted: int) -> None:
        self.session.sent(size - counted)
        self.bytes_sent += size
        self._on_bytes(size)


def _packed_pieces(sections: list[bytes], count: int, controls: list[str], max_bytes: int) -> tuple[list[bytes], int, bool]:
    """One message of a packed pass of ``count`` ``sections``: alone, or with ``controls``
    (control messages) after it in one bundle when they fit ``max_bytes``.
    Returns the pieces to write side by side, their size, and whether ``tail`` went with them."""
    packed_size = HEADER.size + sum(map(len, sections))
    tail = encode_parts(controls) if controls else b""
    if tail and OVERHEAD + PART.size + packed_size + len(tail) <= max_bytes:
        pieces = [*bundle_pieces(1 + len(controls), PART.pack(PART_BINARY, packed_size), packed_header(count),
                                 *sections), tail]
        return pieces, OVERHEAD + PART.size + packed_size + len(tail), True
    return [packed_header(count), *sections], packed_size, False


def control_text(msg: Any) -> str:
    """``M.encode(msg)``, with ``cycle_complete`` (one per pass per connection, the most frequent
    control message) formatted directly: the generic encoder was ~5 % of a fan-out pass."""
    if type(msg) is M.CycleComplete and type(msg.cycle) is int:
        return f'{{"type":"cycle_complete","cycle":{msg.cycle}}}'
    return M.encode(msg)
