"""Shared pieces of the stream end-to-end tests."""
from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.config import EngineConfig

PARTITIONS = 8


def key_in(partition: int, prefix: str = "k", partitions: int = PARTITIONS, start: int = 0) -> str:
    """The first key ``{prefix}{i}`` (i >= start) that hashes to ``partition``."""
    for i in range(start, start + 1_000_000):
        key = f"{prefix}{i}"
        if zlib.crc32(key.encode()) % partitions == partition:
            return key
    raise AssertionError("no key found")


def keys_in(partitions: set[int], n: int, prefix: str = "k", total: int = PARTITIONS) -> list[str]:
    """``n`` distinct keys, all hashing into ``partitions``."""
    out = []
    i = 0
    while len(out) < n:
        key = f"{prefix}{i}"
        if zlib.crc32(key.encode()) % total in partitions:
            out.append(key)
        i += 1
    return out


def engine_contents(data_dir: Path) -> tuple[dict[str, bytes], dict[int, int]]:
    """Live documents and high seqnos read straight from a stopped server's data dir."""
    from engine.engine import Engine

    docs: dict[str, bytes] = {}
    highs: dict[int, int] = {}
    with Engine.open(EngineConfig(data_dir=data_dir)) as engine:
        for p in range(engine.num_partitions):
            highs[p] = engine.high_seqno(p)
            latest: dict[bytes, Any] = {}
            with engine.snapshot(p, 0) as snap:
                for item in snap.items():
                    latest[item.key] = item
            for key, item in latest.items():
                if not item.deleted:
                    docs[key.decode()] = item.value
    return docs, highs


def is_msg(kind: str, **fields: Any) -> Callable[[Any], bool]:
    return lambda m: isinstance(m, dict) and m.get("type") == kind and all(m.get(k) == v for k, v in fields.items())
