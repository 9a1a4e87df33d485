"""Index runs as Parquet files handled in the driver with pyarrow, without a Spark job.

Small batches and small merges cost a Spark job more in fixed overhead than in work, so the
driver writes such runs itself, merges a few small runs itself, and counts a run's rows from the
Parquet footers.  The merge keeps ``view.runs_frame``'s semantics, so either path gives the same
index.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .manifest import Run

__all__ = ["merge_runs_locally", "write_entries", "parquet_rows"]


def merge_runs_locally(root: Path, runs: tuple[Run, ...], out: Path) -> None:
    """``runs_frame`` semantics for a few small runs, in pyarrow: each key keeps the rows of its
    newest run (markers included), after each run's resets dropped older rows of its partitions."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    columns = ["value", "key", "partition", "seqno"]
    tables = []
    for i, run in enumerate(runs):
        files = sorted((root / run.path).glob("*.parquet"))
        t = pa.concat_tables([pq.read_table(f, columns=columns) for f in files]) if files else None
        if t is not None and t.num_rows:
            tables.append(t.append_column("_run", pa.array([i] * t.num_rows, pa.int32())))
    out.mkdir(parents=True)
    if not tables:
        pq.write_table(pa.table({"value": pa.array([], pa.string()), "key": pa.array([], pa.string()),
                                 "partition": pa.array([], pa.int32()), "seqno": pa.array([], pa.int64())}),
                       out / "part-00000.parquet")
        return
    t = pa.concat_tables(tables)
    for p, last in {p: i for i, r in enumerate(runs) for p in r.resets}.items():
        t = t.filter(pc.or_(pc.not_equal(t["partition"], p), pc.greater_equal(t["_run"], last)))
    newest = t.group_by("key").aggregate([("_run", "max")])
    t = t.join(newest, "key").filter(pc.equal(pc.field("_run"), pc.field("_run_max")))
    pq.write_table(t.select(columns), out / "part-00000.parquet")


def write_entries(path: Path, batches: list[Any]) -> None:
    """One Parquet file of index rows (``ENTRY_SCHEMA`` columns) written by the driver."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    schema = pa.schema([("value", pa.string()), ("key", pa.string()), ("partition", pa.int32()),
                        ("seqno", pa.int64())])
    table = pa.Table.from_batches([b.select(schema.names) for b in batches], schema) if batches \
        else schema.empty_table()
    path.mkdir(parents=True)
    pq.write_table(table, path / "part-00000.parquet")


def parquet_rows(path: Path) -> int:
    """Rows of a written run from the Parquet footers (no Spark job)."""
    import pyarrow.parquet as pq
    return sum(pq.ParquetFile(f).metadata.num_rows for f in path.glob("*.parquet"))
