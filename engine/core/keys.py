"""Key validation and the key → partition hash.

The hash is documented and stable because clients compute it too (to know which
partition a key's changes arrive on): ``zlib.crc32(utf8_key) % partitions``.
"""
from __future__ import annotations

import zlib

from engine.core.errors import InvalidKey

MAX_KEY_BYTES = 250


def encode_key(key: str, max_bytes: int = MAX_KEY_BYTES) -> bytes:
    """Validate a key and return its UTF-8 bytes; raise ``InvalidKey`` naming the problem."""
    if not isinstance(key, str):
        raise InvalidKey("key must be a string", field="key")
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKey("key is not valid UTF-8 (lone surrogate)", field="key") from None
    if not raw:
        raise InvalidKey("key must not be empty", field="key")
    if len(raw) > max_bytes:
        raise InvalidKey(f"key is {len(raw)} bytes; the limit is {max_bytes}", field="key")
    return raw


def decode_key(raw: bytes, max_bytes: int = MAX_KEY_BYTES) -> str:
    """Validate raw key bytes (e.g. from a URL path) and return the text key."""
    try:
        key = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidKey("key is not valid UTF-8", field="key") from None
    encode_key(key, max_bytes)
    return key


def partition_for_key(raw_key: bytes, partitions: int) -> int:
    """The partition that owns a UTF-8 encoded key: the one home of the hash (the engine's
    write path, ``Engine.partition_of`` and ``Engine.get`` call it; clients may too)."""
    return zlib.crc32(raw_key) % partitions
