"""WebSocket frame headers for messages a server sends (RFC 6455, section 5.2), pure.

WHY here: a server's frames are unmasked and carry one whole message each, so a frame is a
header of 2, 4 or 10 bytes that depends only on the message's kind and length, followed by the
message's bytes unchanged.  A stream server that sends the same encoded bytes to many connections
can therefore write the header and the shared bytes side by side (``transport.writelines``)
instead of having a WebSocket library copy them into a new frame per connection
(``app.stream.rawframes``).  Extensions (permessage-deflate) change the payload and are not
covered: the caller only frames this way when none was negotiated.
"""
from __future__ import annotations

import struct

__all__ = ["OP_BINARY", "OP_TEXT", "frame_header"]

OP_TEXT = 0x1
OP_BINARY = 0x2
_FIN = 0x80
_LEN16 = struct.Struct("!BBH")
_LEN64 = struct.Struct("!BBQ")


def frame_header(opcode: int, length: int) -> bytes:
    """The header of one unfragmented, unmasked frame of ``length`` payload bytes."""
    if opcode not in (OP_TEXT, OP_BINARY):
        raise ValueError(f"opcode {opcode} is not a data frame's")
    if length < 0:
        raise ValueError("length must not be negative")
    first = _FIN | opcode
    if length < 126:
        return bytes((first, length))
    if length < 1 << 16:
        return _LEN16.pack(first, 126, length)
    return _LEN64.pack(first, 127, length)
