"""Keys that land in chosen partitions.

The hash is written out here (crc32 of the UTF-8 key, modulo the partition count: the documented
rule) instead of calling the engine's, so a test that places keys this way also checks the rule."""
from __future__ import annotations

import zlib
from collections.abc import Container

#: The partition count the HTTP and stream test servers run with.
PARTITIONS = 8


def partition_of(key: str, partitions: int = PARTITIONS) -> int:
    return zlib.crc32(key.encode()) % partitions


def key_in(partition: int, prefix: str = "k", partitions: int = PARTITIONS, start: int = 0) -> str:
    """The first key ``{prefix}{i}`` (i >= start) that hashes to ``partition``."""
    for i in range(start, start + 1_000_000):
        key = f"{prefix}{i}"
        if partition_of(key, partitions) == partition:
            return key
    raise AssertionError(f"no key with prefix {prefix!r} hashes to partition {partition} of {partitions}")


def keys_in(partitions: Container[int], n: int, prefix: str = "k", total: int = PARTITIONS) -> list[str]:
    """``n`` distinct keys ``{prefix}{i}``, all hashing into ``partitions`` (of ``total``)."""
    out = []
    i = 0
    while len(out) < n:
        key = f"{prefix}{i}"
        if partition_of(key, total) in partitions:
            out.append(key)
        i += 1
    return out
