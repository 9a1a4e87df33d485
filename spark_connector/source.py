"""The ``upr`` PySpark data source: ``spark.readStream.format("upr")`` and ``spark.read.format("upr")``.

Process model (README.md here; ../shared/notes/spark.md §1.2): Spark builds reader instances in two
driver processes and pickles ``read`` to executors, so nothing here opens a connection in
``__init__`` and everything ``read()`` needs travels inside the ``UprInputPartition``.  The driver's long-lived reader process fetches
metadata per trigger (one HTTP round trip), checks every held position with the server's rollback
rule *before* planning, and applies ``onRollback``.  ``startingOffsets`` is used only when the
checkpoint is new; a restarted query resumes from its checkpointed offsets.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from .meta import fetch_routed, local_check
from .offsets import SourceOffset
from .options import BATCH_BYTES, Position, SourceOptions, parse_options
from .planning import WorkItem, plan_tasks
from .progress import (
    ServerMeta,
    check_same_partitions,
    initial_offset,
    lag_metrics,
    next_offset,
    resolve_positions,
    select_partitions,
)
from .retry import RetryPolicy
from .rows import SCHEMA_DDL

NAME = "upr"


@dataclass(frozen=True)
class UprInputPartition(InputPartition):
    """One Spark task: a few bounded stream requests served over one connection."""

    server: str
    token: str | None
    items: tuple[WorkItem, ...]
    batch_rows: int
    timeout: float
    retry: RetryPolicy = RetryPolicy()   # for the stream connect and each move to another node
    #: every node URL the user named: where the task reads the map when a partition moves
    servers: tuple[str, ...] = ()
    #: (partition, active node URL) as planning saw the map; empty: a single server, or unknown
    #: (a batch replayed by a new driver process), in which case the task reads the map itself
    routes: tuple[tuple[int, str], ...] = ()
    batch_bytes: int = BATCH_BYTES


def _input_partitions(opts: SourceOptions, start: SourceOffset, end: SourceOffset,
                      routes: dict[int, str] | None = None) -> list[UprInputPartition]:
    out = []
    for group in plan_tasks(start, end, opts.min_partitions):
        wanted = {w.partition for w in group}
        hint = tuple(sorted((p, url) for p, url in (routes or {}).items() if p in wanted))
        out.append(UprInputPartition(opts.server, opts.token, tuple(group), opts.batch_rows, opts.timeout,
                                     opts.retry, opts.seeds, hint, opts.batch_bytes))
    return out


def _read(partition: UprInputPartition) -> Iterator[Any]:
    from .task import read_task   # imported on the executor only; keeps driver start-up light
    yield from read_task(partition)


class UprDataSource(DataSource):
    """Rows: partition, seqno, key, op (mutation/deletion/reset/rollback), value, cas, rev,
    snap_start, snap_end.  Options: see ``spark_connector.options.KNOWN``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        parse_options(options)   # fail fast, naming the bad option, when the DataFrame is defined

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return UprBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return UprStreamReader(self.options)


class UprBatchReader(DataSourceReader):
    """A bounded read from ``startingOffsets`` to ``endingOffsets`` (both resolved at planning)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.opts = parse_options(options)

    def partitions(self) -> list[UprInputPartition]:
        meta, routes = fetch_routed(self.opts)
        selected = select_partitions(meta, self.opts.partitions)
        start = resolve_positions(self.opts.starting, meta, selected)
        ending = resolve_positions(self.opts.ending, meta, selected, unlisted=Position.LATEST)
        end = next_offset(start, meta, check=local_check, policy=self.opts.on_rollback,
                          target={p: o.seqno for p, o in ending.partitions.items()})
        return _input_partitions(self.opts, start, end, routes)

    def read(self, partition: UprInputPartition) -> Iterator[Any]:   # type: ignore[override]
        return _read(partition)


class UprStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.opts = parse_options(options)
        self._target: dict[int, int] | None = None    # AvailableNow: never plan past these seqnos
        self._fresh: ServerMeta | None = None          # metadata fetched by prepareForTriggerAvailableNow
        self._planned: SourceOffset | None = None      # the end offset latestOffset returned last
        self._held: dict[int, str] = {}                # partitions that plan left where they were, and why
        self._routes: dict[int, str] | None = None     # each partition's active node, as last fetched

    # ---------------------------------------------------------------- offsets (driver)
    def initialOffset(self) -> dict[str, Any]:
        meta, _ = fetch_routed(self.opts, partial=True)     # the partitions, not their seqnos
        return initial_offset(self.opts.starting, meta, select_partitions(meta, self.opts.partitions)).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def _fetch(self) -> ServerMeta:
        meta, self._routes = fetch_routed(self.opts, partial=True)
        return meta

    def prepareForTriggerAvailableNow(self) -> None:
        meta = self._fetch()
        self._target = {p: meta.partitions[p].high_seqno for p in select_partitions(meta, self.opts.partitions)
                        if p in meta.partitions}
        self._fresh = meta    # Spark calls latestOffset right after this: one round trip instead of two

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        meta, self._fresh = self._fresh or self._fetch(), None
        selected = select_partitions(meta, self.opts.partitions)
        self._held = {p: why for p, why in meta.unavailable.items() if p in selected}
        if start is None:
            # Spark 4.0/4.1 call latestOffset() without the start: all they can be told is "the
            # high seqnos now" (no read limit; a branch is met by read() as a reset row).
            return resolve_positions(Position.LATEST, meta, selected).to_json()
        begin = SourceOffset.from_json(start)
        if begin.latest_sentinel:
            # Batch 0 of startingOffsets=latest: sentinel -> "now", planned as an empty batch, so a
            # replay of it is identical however late it runs.
            if any(p in meta.unavailable for p in selected):
                return start          # "now" needs every partition's high seqno: next trigger
            end = resolve_positions(self.opts.starting, meta, selected)
        else:
            check_same_partitions(begin, selected)
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            end = next_offset(begin, meta, check=local_check, policy=self.opts.on_rollback,
                              max_rows=max_rows, target=self._target)
        self._planned = end
        return end.to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Shown as ``latestOffset`` in the query's progress, with Kafka's lag figures beside the
        offset (``min/avg/maxOffsetsBehindLatest``: seqnos between the batch just planned and the
        high seqnos now), since Spark has no metrics hook for Python sources."""
        meta, _ = fetch_routed(self.opts, partial=True)
        readable = [p for p in select_partitions(meta, self.opts.partitions) if p in meta.partitions]
        latest = resolve_positions(Position.LATEST, meta, readable)
        # WHY the plan's view first: a partition held by the batch just planned is still unserved
        # by it even if the map moved it since, and Trigger.AvailableNow ends on the plan alone,
        # so an index run that read "available now" here would stop short of it
        unavailable = {str(p): why for p, why in sorted({**meta.unavailable, **self._held}.items())}
        return {**latest.to_json(), **lag_metrics(self._planned, latest),
                **({"unavailablePartitions": unavailable} if unavailable else {})}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[UprInputPartition]:
        return _input_partitions(self.opts, SourceOffset.from_json(start), SourceOffset.from_json(end), self._routes)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark calls this one batch late (../shared/notes/spark.md §1.3); durable progress is the checkpoint."""

    # ---------------------------------------------------------------- executors
    def read(self, partition: UprInputPartition) -> Iterator[Any]:   # type: ignore[override]
        return _read(partition)
