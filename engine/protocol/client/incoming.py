"""Server frames as the client receives them: sizes, bundles and decoding, one way for every reader.

A WebSocket message is text (a JSON message), a binary item batch (``engine.protocol.frames``), a
packed pass (``engine.protocol.packed``, after hello ``frames: packed``) or a bundle of those
(``engine.protocol.bundle``).  Flow control counts each message's size once all it
carried is processed, so a bundle's parts each account for their own size and the last one also
for the bundle's header bytes: the acknowledgements add up to the message's size.  Corrupt input
becomes ``ProtocolViolation`` (the server broke the protocol), naming the field.
"""
from __future__ import annotations

import re
from typing import Any

from engine.protocol import messages as M
from engine.protocol import bundle
from engine.protocol.bundle import decode_bundle
from engine.protocol.errors import ProtocolError
from engine.protocol.frames import decode_binary
from engine.protocol.packed import PACKED_MAGIC, PackedPass, decode_packed

from .errors import ProtocolViolation

__all__ = ["PackedPass", "frame_bytes", "is_bundle", "split_bundle", "decode_frame", "unpacked"]


def frame_bytes(frame: str | bytes) -> int:
    """The size flow control counts for a received message (its UTF-8 bytes for text)."""
    if isinstance(frame, str):
        return len(frame) if frame.isascii() else len(frame.encode())
    return len(frame)


def is_bundle(frame: str | bytes) -> bool:
    """A received message is a bundle (text messages never are)."""
    return isinstance(frame, bytes) and bundle.is_bundle(frame)


def split_bundle(frame: bytes, nbytes: int) -> list[tuple[str | bytes, int]]:
    """A bundle's parts with the bytes each accounts for (see the module docstring)."""
    try:
        parts = decode_bundle(frame)
    except ProtocolError as exc:
        raise ProtocolViolation(f"server sent a corrupt bundle: {exc.message}", field=exc.field) from None
    shares = [(part, frame_bytes(part)) for part in parts]
    last, size = shares[-1]
    shares[-1] = (last, size + nbytes - sum(n for _, n in shares))
    return shares


def decode_frame(frame: str | bytes) -> Any:
    """One server message (not a bundle): an ``ItemBatch`` for a binary batch, a ``PackedPass``
    for a packed pass (hello ``frames: packed``), else a ``messages`` type."""
    if isinstance(frame, bytes):
        if frame[:4] == PACKED_MAGIC:
            try:
                return decode_packed(frame)
            except ProtocolError as exc:
                raise ProtocolViolation(f"server sent a corrupt packed pass: {exc.message}", field=exc.field) from None
        try:
            return decode_binary(frame)
        except ProtocolError as exc:
            raise ProtocolViolation(f"server sent a corrupt batch: {exc.message}", field=exc.field) from None
    routine = _routine(frame)
    if routine is not None:
        return routine
    try:
        return M.decode_server_message(frame)
    except ProtocolError as exc:
        raise ProtocolViolation(f"server sent an invalid message: {exc.message}", field=exc.field) from None


# The two messages a tailing stream receives with (nearly) every batch, in the exact form the server
# renders them (``app.stream.cursor.marker_text``, ``app.stream.outbox.control_text``).
_U = r"(0|[1-9][0-9]{0,19})"
_MARKER = re.compile(r'\{"type":"snapshot","partition":%s,"start":%s,"end":%s,"source":"([a-z_]{1,32})",'
                     r'"purge_seqno":%s\}\Z' % (_U, _U, _U, _U))
_CYCLE = re.compile(r'\{"type":"cycle_complete","cycle":%s\}\Z' % _U)
_SOURCES = {s.value: s for s in M.SnapshotSource}
_MARKER_KINDS = [M.SnapshotMarker.FIELDS[f] for f in ("partition", "start", "end", "purge_seqno")]  # type: ignore[attr-defined]
_CYCLE_KIND = M.CycleComplete.FIELDS["cycle"]  # type: ignore[attr-defined]


def _routine(text: str) -> Any:
    """A snapshot marker or cycle end in the server's own rendering, decoded without the generic
    JSON path; None for anything else (which the generic, strict decoder then handles).

    WHY: a consumer that tails gets a marker with every batch, and parsing it through ``json`` and
    the field table cost more than decoding the batch (profiled, docs/benchmarks.md, Peers).  Only
    text the generic decoder would accept with the same result matches: the exact compact layout,
    plain non-negative integers within each field's bounds, a known source."""
    if text.startswith('{"type":"snapshot",'):
        m = _MARKER.match(text)
        if m is None:
            return None
        p, start, end, source, purge = m.groups()
        values = (int(p), int(start), int(end), int(purge))
        kind = _SOURCES.get(source)
        if kind is None or any(not k.lo <= v <= k.hi for k, v in zip(_MARKER_KINDS, values)):
            return None
        return M.SnapshotMarker(values[0], values[1], values[2], kind, values[3])
    if text.startswith('{"type":"cycle_complete",'):
        m = _CYCLE.match(text)
        if m is None:
            return None
        cycle = int(m.group(1))
        return M.CycleComplete(cycle) if _CYCLE_KIND.lo <= cycle <= _CYCLE_KIND.hi else None
    return None


def unpacked(packed: PackedPass, nbytes: int) -> list[tuple[Any, int]]:
    """A packed pass as the markers and batches it stands for, in order, with the bytes each
    accounts for: the pass's size on the last one (flow control acknowledges a message once all
    it carried is processed)."""
    out: list[tuple[Any, int]] = [(msg, 0) for msg in packed.messages()]
    out[-1] = (out[-1][0], nbytes)
    return out
