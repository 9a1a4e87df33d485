"""Pieces of the stream end-to-end tests that are not the oracle client itself."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.config import EngineConfig


def is_msg(kind: str, **fields: Any) -> Callable[[Any], bool]:
    """A predicate for ``RawStream.until``: a message of ``kind`` whose fields equal ``fields``."""
    return lambda m: isinstance(m, dict) and m.get("type") == kind and all(m.get(k) == v for k, v in fields.items())


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
