"""The ``upr`` Spark source and incremental index jobs (see README.md in this directory).

Imports are lazy so ``upr`` subcommands that never touch Spark do not pay for importing PySpark.
"""
from __future__ import annotations

TYPE_CHECKING = False   # typing only for the checkers: `upr index query` imports this module (docs/benchmarks.md)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["FieldIndex", "IndexJob", "UprDataSource", "load_index", "local_session"]

_WHERE = {
    "FieldIndex": "spark_connector.index.functions",
    "IndexJob": "spark_connector.index.job",
    "UprDataSource": "spark_connector.source",
    "load_index": "spark_connector.index.view",
    "local_session": "spark_connector.session",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'spark_connector' has no attribute {name!r}")
