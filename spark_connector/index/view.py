"""Reading an index generation as one DataFrame (what ``upr index query`` and users query).

Rows of a run supersede, key by key, the rows of older runs, and a run's ``resets`` kill every
older row of those partitions.  Rows with ``value`` NULL are markers: "this key exists (or was
deleted) at this seqno and has no entries"; they are kept so rollbacks can find every key changed
after a seqno (until compaction drops those at or below the server's purge seqno), and hidden
from the public view.
"""
from __future__ import annotations

import os
from typing import Any

from .manifest import Manifest, load
from .sparkio import ENTRY_SCHEMA, read_runs
from .storage import Location, open_location


def runs_frame(spark: Any, index_dir: str | os.PathLike[str] | Location, manifest: Manifest,
               markers: bool = False) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    where = index_dir if isinstance(index_dir, Location) else open_location(index_dir)
    runs = [r for r in manifest.runs]
    frames = read_runs(spark, where, [r.path for r in runs])
    if not runs:
        df = spark.createDataFrame([], ENTRY_SCHEMA)
    elif len(runs) == 1:
        df = frames[0]
    else:
        parts = [frame.withColumn("_run", F.lit(i)) for i, frame in enumerate(frames)]
        df = parts[0]
        for p in parts[1:]:
            df = df.unionByName(p)
        last_reset: dict[int, int] = {}
        for i, r in enumerate(runs):
            for p in r.resets:
                last_reset[p] = i
        if last_reset:
            alive = None
            for p, i in sorted(last_reset.items()):
                alive = (F.when(F.col("partition") == p, F.col("_run") >= i) if alive is None
                         else alive.when(F.col("partition") == p, F.col("_run") >= i))
            df = df.filter(alive.otherwise(F.lit(True)))
        newest = F.max("_run").over(Window.partitionBy("key"))
        df = df.withColumn("_newest", newest).filter(F.col("_run") == F.col("_newest")).drop("_run", "_newest")
    if not markers:
        df = df.filter(F.col("value").isNotNull())
    return df


def load_index(spark, index_dir: str | os.PathLike[str] | Location, markers: bool = False):  # type: ignore[no-untyped-def]
    """The current generation of the index at ``index_dir`` (a path or URI) as a DataFrame
    (``value, key, partition, seqno``); register it with ``createOrReplaceTempView`` to use SQL."""
    where = index_dir if isinstance(index_dir, Location) else open_location(index_dir)
    manifest = load(where)
    if manifest is None:
        raise FileNotFoundError(f"{where.display()}: no index here (manifest.json missing)")
    return runs_frame(spark, where, manifest, markers)
