"""Server frames as the client receives them: sizes, bundles and decoding, one way for every reader.

A WebSocket message is text (a JSON message), a binary item batch (``engine.protocol.frames``) or a
bundle of those (``engine.protocol.bundle``).  Flow control counts each message's size once all it
carried is processed, so a bundle's parts each account for their own size and the last one also
for the bundle's header bytes: the acknowledgements add up to the message's size.  Corrupt input
becomes ``ProtocolViolation`` (the server broke the protocol), naming the field.
"""
from __future__ import annotations

from typing import Any

from engine.protocol import messages as M
from engine.protocol import bundle
from engine.protocol.bundle import decode_bundle
from engine.protocol.errors import ProtocolError
from engine.protocol.frames import decode_binary

from .errors import ProtocolViolation

__all__ = ["frame_bytes", "is_bundle", "split_bundle", "decode_frame"]


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
    """One server message (not a bundle): an ``ItemBatch`` for binary, else a ``messages`` type."""
    if isinstance(frame, bytes):
        try:
            return decode_binary(frame)
        except ProtocolError as exc:
            raise ProtocolViolation(f"server sent a corrupt batch: {exc.message}", field=exc.field) from None
    try:
        return M.decode_server_message(frame)
    except ProtocolError as exc:
        raise ProtocolViolation(f"server sent an invalid message: {exc.message}", field=exc.field) from None
