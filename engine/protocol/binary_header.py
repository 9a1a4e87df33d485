"""The 16-byte header that starts both binary messages, checked in one place.

Item batch frames (``engine.protocol.frames``) and bundles (``engine.protocol.bundle``) share one
header layout, all integers little-endian::

    offset  size   field
    0       4      magic: b"UPRB" item batch, b"UPRM" bundle (how a client tells them apart)
    4       1      version
    5       1      flags (only the bits the format defines may be set)
    6       2      u16: the batch's partition; reserved (0) in a bundle
    8       4      count (u32): items in a batch, parts in a bundle
    12      4      reserved, must be 0

Every decoder of either message (the client's, the Spark task's fast Arrow path) checks the
header through ``BinaryFormat.check_header``, so a corrupt header is refused with the same
``ProtocolError(corrupt_frame)`` naming the same field wherever it arrives.  What follows the
header (columns, parts) is each format's own business.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from engine.protocol.errors import ErrorCode, ProtocolError

__all__ = ["HEADER", "BinaryFormat"]

HEADER = struct.Struct("<4sBBHII")


@dataclass(frozen=True, slots=True)
class BinaryFormat:
    """One binary message format: its magic, version and defined flag bits."""

    #: what the message is called in error messages ("item batch", "bundle")
    name: str
    magic: bytes
    version: int
    #: the flag bits this format defines; any other set bit is corruption
    flags: int = 0

    def corrupt(self, field: str, message: str) -> ProtocolError:
        """The error for a malformed message of this format, naming the offending field."""
        return ProtocolError(ErrorCode.CORRUPT_FRAME, f"corrupt {self.name}: {field}: {message}", field=field)

    def matches(self, data: bytes | bytearray | memoryview) -> bool:
        """Whether ``data`` claims to be this format (its magic), before any other check."""
        return bytes(data[:4]) == self.magic

    def pack_header(self, flags: int, word: int, count: int) -> bytes:
        return HEADER.pack(self.magic, self.version, flags, word, count, 0)

    def check_header(self, data: bytes | bytearray | memoryview) -> tuple[int, int, int]:
        """``(flags, u16 word, count)`` of a well-formed header; ``ProtocolError(corrupt_frame)``
        naming ``header``, ``magic``, ``version``, ``flags`` or ``reserved`` otherwise."""
        size = len(data)
        if size < HEADER.size:
            raise self.corrupt("header", f"{size} bytes is shorter than the {HEADER.size}-byte header")
        magic, version, flags, word, count, reserved = HEADER.unpack_from(data, 0)
        if magic != self.magic:
            raise self.corrupt("magic", f"expected {self.magic!r}, got {bytes(magic)!r}")
        if version != self.version:
            raise self.corrupt("version", f"unsupported {self.name} version {version}")
        if flags & ~self.flags:
            raise self.corrupt("flags", f"unknown flag bits {flags:#04x}")
        if reserved:
            raise self.corrupt("reserved", "must be 0")
        return flags, word, count
