"""Index runs as Parquet files handled in the driver with pyarrow, without a Spark job.

Small batches and small merges cost a Spark job more in fixed overhead than in work, so the
driver writes such runs itself, merges a few small runs itself, and counts a run's rows from the
Parquet footers.  The merge keeps ``view.runs_frame``'s semantics, so either path gives the same
index.  Everything goes through a ``storage.Location``: a local directory or a remote URI.
"""
from __future__ import annotations

from typing import Any

from .manifest import Run
from .storage import Location

__all__ = ["ENTRY_ARROW_FIELDS", "merge_runs_locally", "write_entries", "parquet_rows", "read_run"]

#: The columns of an index run, in order, as (name, pyarrow type name).
ENTRY_ARROW_FIELDS = (("value", "string"), ("key", "string"), ("partition", "int32"), ("seqno", "int64"))


def entry_schema() -> Any:
    import pyarrow as pa
    return pa.schema([(name, getattr(pa, kind)()) for name, kind in ENTRY_ARROW_FIELDS])


def read_run(where: Location, rel: str) -> Any:
    """Every row of the run at ``rel`` as one table (empty when it has no files)."""
    import pyarrow as pa
    tables = []
    for path in where.parquet_files(rel):
        with where.open_parquet(path) as pf:
            tables.append(pf.read(columns=[n for n, _ in ENTRY_ARROW_FIELDS]))
    return pa.concat_tables(tables) if tables else entry_schema().empty_table()


def merge_runs_locally(where: Location, runs: tuple[Run, ...], out: str) -> None:
    """``runs_frame`` semantics for a few small runs, in pyarrow: each key keeps the rows of its
    newest run (markers included), after each run's resets dropped older rows of its partitions."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = [n for n, _ in ENTRY_ARROW_FIELDS]
    tables = []
    for i, run in enumerate(runs):
        t = read_run(where, run.path)
        if t.num_rows:
            tables.append(t.append_column("_run", pa.array([i] * t.num_rows, pa.int32())))
    if not tables:
        where.write_parquet(f"{out}/part-00000.parquet", entry_schema().empty_table())
        return
    t = pa.concat_tables(tables)
    for p, last in {p: i for i, r in enumerate(runs) for p in r.resets}.items():
        t = t.filter(pc.or_(pc.not_equal(t["partition"], p), pc.greater_equal(t["_run"], last)))
    newest = t.group_by("key").aggregate([("_run", "max")])
    t = t.join(newest, "key").filter(pc.equal(pc.field("_run"), pc.field("_run_max")))
    where.write_parquet(f"{out}/part-00000.parquet", t.select(columns))


def write_entries(where: Location, rel: str, batches: list[Any]) -> None:
    """One Parquet file of index rows (``ENTRY_SCHEMA`` columns) written by the driver."""
    import pyarrow as pa
    schema = entry_schema()
    table = pa.Table.from_batches([b.select(schema.names) for b in batches], schema) if batches \
        else schema.empty_table()
    where.write_parquet(f"{rel}/part-00000.parquet", table)


def parquet_rows(where: Location, rel: str) -> int:
    """Rows of a written run from the Parquet footers (no Spark job)."""
    total = 0
    for path in where.parquet_files(rel):
        with where.open_parquet(path) as pf:
            total += pf.metadata.num_rows
    return total
