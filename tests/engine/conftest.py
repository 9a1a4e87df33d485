"""Engines on real LMDB in a per-test temporary directory."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import Engine


@pytest.fixture
def make_engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    opened: list[Engine] = []

    def make(**overrides: object) -> Engine:
        settings: dict[str, object] = {"data_dir": tmp_path / "data", "partitions": 4, "flush_interval_ms": 2.0}
        settings.update(overrides)
        engine = Engine.open(EngineConfig(**settings))  # type: ignore[arg-type]
        opened.append(engine)
        return engine

    yield make
    for engine in opened:
        engine.close()


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Engine:
    return make_engine()
