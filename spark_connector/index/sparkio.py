"""Spark frames to and from index runs wherever the index lives.

A local (or shared-mount) index is read and written by Spark's own Parquet reader and writer.
An index at a remote URI (``s3://``, ``gs://``, ``hdfs://``, an fsspec scheme) goes through the
same ``pyarrow`` filesystem the lookups use, inside Spark tasks: Spark's writers would need the
scheme's Hadoop connector on the classpath (``hadoop-aws`` and its SDK for ``s3a://``), which a
pip-installed PySpark does not carry, while the ``Location`` (a picklable pyarrow filesystem
and a base path) travels to the executors as is.

Writes without Spark's commit protocol stay exact: every task writes one file named after its
partition and attempt and returns the name; the driver keeps the returned files and deletes any
other file in the run (a failed attempt's leftovers) before the manifest names the run.  A run
directory is new for every batch attempt, so nothing else writes there.
"""
from __future__ import annotations

import functools
import uuid as uuidlib
from collections.abc import Iterator, Sequence
from typing import Any

from .storage import Location

__all__ = ["ENTRY_SCHEMA", "read_runs", "write_frame"]

ENTRY_SCHEMA = "value STRING, key STRING, partition INT, seqno BIGINT"


def read_runs(spark: Any, where: Location, paths: Sequence[str]) -> list[Any]:
    """One DataFrame (``ENTRY_SCHEMA``) per run directory in ``paths``, oldest first."""
    if where.is_local:
        return [spark.read.schema(ENTRY_SCHEMA).parquet(where.path(rel)) for rel in paths]
    return [_remote_frame(spark, where, where.parquet_files(rel)) for rel in paths]


def _remote_frame(spark: Any, where: Location, files: list[str]) -> Any:
    if not files:
        return spark.createDataFrame([], ENTRY_SCHEMA)
    slices = max(1, min(len(files), spark.sparkContext.defaultParallelism))
    names = spark.createDataFrame([(f,) for f in files], "file STRING").repartition(slices)
    return names.mapInArrow(functools.partial(_read_files, where), ENTRY_SCHEMA)


def _read_files(where: Location, batches: Iterator[Any]) -> Iterator[Any]:
    from .runfiles import ENTRY_ARROW_FIELDS
    columns = [n for n, _ in ENTRY_ARROW_FIELDS]
    for batch in batches:
        for path in batch.column("file").to_pylist():
            with where.open_parquet(path) as pf:
                yield from pf.iter_batches(columns=columns)


def write_frame(frame: Any, where: Location, rel: str) -> None:
    """Write ``frame`` (``ENTRY_SCHEMA`` columns) as the run directory ``rel``."""
    if where.is_local:
        frame.write.mode("errorifexists").parquet(where.path(rel))
        return
    where.make_dir(rel)
    tag = uuidlib.uuid4().hex[:8]
    written = {row.file for row in frame.mapInArrow(functools.partial(_write_task, where, rel, tag),
                                                     "file STRING, rows BIGINT").collect() if row.file}
    for path in where.parquet_files(rel):
        if path not in written:            # a failed or duplicate task attempt's file
            where.remove_file(path)


def _write_task(where: Location, rel: str, tag: str, batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    from .runfiles import entry_schema

    schema = entry_schema()
    ctx = TaskContext.get()
    part, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)
    path = where.path(f"{rel}/part-{part:05d}-{attempt}-{tag}.parquet")
    rows = 0
    writer = None
    out = None
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if writer is None:
                out = where.fs.open_output_stream(path)
                writer = pq.ParquetWriter(out, schema)
            writer.write_batch(pa.RecordBatch.from_arrays(
                [batch.column(n).cast(schema.field(n).type) for n in schema.names], schema=schema))
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
        if out is not None:
            out.close()
    yield pa.RecordBatch.from_pydict({"file": [path if rows else None], "rows": [rows]},
                                     pa.schema([("file", pa.string()), ("rows", pa.int64())]))
