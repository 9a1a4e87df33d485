"""Incremental index jobs: the change feed, through the ``upr`` source, into index generations.

The first run over a keyspace is a full build (new checkpoint, ``startingOffsets=earliest``);
every later run resumes the same checkpoint with ``Trigger.AvailableNow`` and so reads only what
changed since.  Each micro-batch becomes one run of Parquet rows in ``foreachBatch``:

1. skip the batch if the manifest already has it (Spark replays a batch whose commit it did not
   log: the index and the checkpoint advance together, with the manifest as the commit point);
2. index each changed document once at its newest seqno in the batch (deletions and documents
   without entries leave a marker row, so stale rows of older runs are superseded) and write the
   run, in one Spark job; accumulators report the items read and the control rows seen.  A batch
   spanning at most ``local_batch_rows`` seqnos (a typical incremental run) brings its index rows
   to the driver, which writes them (no Spark write job);
3. control rows: ``reset`` makes the run kill every older row of its partition (the batch
   restreams it from 0); ``rollback`` at R re-fetches (GET) every key whose rows came from seqnos
   above R and writes their current versions as a later run;
4. compact when there are too many runs (merging the runs since the last major compaction,
   or everything once they have grown to a quarter of the index), and replace the manifest
   atomically.

An index at a remote URI (``s3://bucket/idx``, ``hdfs://``, any pyarrow/fsspec filesystem) is
written and read through that filesystem (``storage.Location``, ``sparkio``).  Its Spark
checkpoint is a local scratch directory for the run: the manifest holds the end offset of the
last batch it applied, and every run starts a new checkpoint from there (``startingOffsets`` =
that offset, batch ids counted on from the manifest's).  So the manifest stays the only commit
point, any host can run the next update, and Spark never needs a Hadoop connector for the scheme.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..redact import redact
from .entries import STAGED_SCHEMA, ListParam, entries_fn
from .functions import IndexFunction, spec_of
from .manifest import IndexError_, Manifest, collect_garbage, commit, load
from .refetch import refetch
from .runfiles import merge_runs_locally, write_entries
from .sidecar import seal_run
from .sparkio import write_frame
from .storage import Location, open_location
from .view import runs_frame

log = logging.getLogger(__name__)


@dataclass
class RunReport:
    batches: int = 0
    skipped: int = 0
    rows_read: int = 0
    resets: list[int] = field(default_factory=list)
    rollbacks: dict[int, int] = field(default_factory=dict)
    refetched: int = 0
    seconds: float = 0.0
    generation: int = 0
    #: partitions that had no live active node at the last trigger (a cluster mid-failover, or a
    #: partition with no copy left): left where they were, taken up by the next run or trigger
    unavailable: dict[int, str] = field(default_factory=dict)
    #: seconds: query start (to the first batch: Spark's source process, offset log, planning),
    #: read+write (the batch's Spark job), sidecar (the run's lookup sidecar, ``sidecar.py``),
    #: refetch, compact, commit (manifest), query end (after the
    #: last batch: commit log, the final "nothing new" check)
    phases: dict[str, float] = field(default_factory=dict)

    def merge(self, later: "RunReport") -> None:
        """Add a later query's report of the same run (``IndexJob.run`` runs again while
        partitions were unserved): counts add up, the outcome is the later one's."""
        self.batches += later.batches
        self.skipped += later.skipped
        self.rows_read += later.rows_read
        self.resets.extend(p for p in later.resets if p not in self.resets)
        self.rollbacks.update(later.rollbacks)
        self.refetched += later.refetched
        self.generation = later.generation
        self.unavailable = dict(later.unavailable)
        for phase, seconds in later.phases.items():
            self.phases[phase] = round(self.phases.get(phase, 0.0) + seconds, 3)

    def _add(self, phase: str, since: float) -> float:
        now = time.monotonic()
        self.phases[phase] = round(self.phases.get(phase, 0.0) + now - since, 3)
        return now


@dataclass(frozen=True)
class BatchProgress:
    """One applied micro-batch, for progress lines: ``changes`` read, the per-partition seqnos the
    index now holds (the batch's end offset), and the batch's wall time in the driver."""

    batch_id: int
    changes: int
    seqnos: dict[int, int]
    seconds: float
    generation: int
    resets: tuple[int, ...] = ()


#: How long a one-shot ``IndexJob.run`` keeps running again while partitions have no live active
#: node: past a failover (a lease's expiry plus the promotion) on the default lease.
UNAVAILABLE_WAIT_S = 30.0
#: Pause between those runs (each is a whole Spark query: seconds of its own).
UNAVAILABLE_RETRY_S = 1.0

#: The keyspace id an index of a cluster records (``clients.backup`` binds archives the same way).
CLUSTER_KEYSPACE = "cluster"

#: Batches spanning at most this many seqnos have their index rows written by the driver.
LOCAL_BATCH_ROWS = 50_000

#: Compaction merges only the runs after the first while they hold less than this fraction of the
#: first run's rows (see ``IndexJob._compact``).
MINOR_FRACTION = 0.25

#: Up to this many rows a minor compaction runs in the driver with pyarrow instead of as a Spark
#: job: a Spark union + window + write pays a shuffle job's fixed cost, which for a few small runs
#: is far above the pyarrow merge (see docs/benchmarks.md, Spark: minor compaction in pyarrow).
MERGE_IN_DRIVER_ROWS = 1_000_000


def _newest_per_key(entries):  # type: ignore[no-untyped-def]
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    newest = F.max("seqno").over(Window.partitionBy("key"))
    return entries.withColumn("_m", newest).filter(F.col("seqno") == F.col("_m")).drop("_m")


def _unavailable(progress: Any) -> dict[int, str]:
    """``unavailablePartitions`` of the source's last reported latest offset, by partition."""
    try:
        latest = progress["sources"][0]["latestOffset"]
        if isinstance(latest, str):
            latest = json.loads(latest)
        return {int(p): str(why) for p, why in (latest or {}).get("unavailablePartitions", {}).items()}
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return {}


def _same_seqnos(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two source offsets hold the same partitions at the same seqnos and generations."""
    def seqnos(offset: dict[str, Any] | None) -> dict[str, tuple[Any, Any]] | None:
        if not offset or offset.get("latest"):
            return None
        return {p: (o.get("s"), o.get("g")) for p, o in offset.get("p", {}).items()}
    return seqnos(a) is not None and seqnos(a) == seqnos(b)


class IndexJob:
    """Build and maintain one index at ``index_dir`` (a path, a ``file://`` URI, a remote URI
    such as ``s3://bucket/idx``, or a ``storage.Location``) from the server at ``server``.

    ``function`` maps ``(key, value bytes)`` to index values; ``FieldIndex("a.b")`` indexes a JSON
    field.  ``source_options`` are passed to the ``upr`` source (e.g. ``maxOffsetsPerTrigger``,
    ``onRollback``).
    """

    def __init__(self, spark: Any, index_dir: str | os.PathLike[str], server: str, function: IndexFunction, *,
                 name: str | None = None, token: str | None = None, max_runs: int = 4,
                 source_options: dict[str, str] | None = None, local_batch_rows: int = LOCAL_BATCH_ROWS,
                 on_batch: Callable[[BatchProgress], None] | None = None) -> None:
        self.spark = spark
        self.where = index_dir if isinstance(index_dir, Location) else open_location(index_dir)
        #: the index directory when it is local (None for a remote URI)
        self.root = Path(self.where.base) if self.where.is_local else None
        self.server = server.rstrip("/")
        self.token = token
        self.function = function
        self.spec = spec_of(function, name)
        self.max_runs = max_runs
        self.local_batch_rows = local_batch_rows
        self.source_options = dict(source_options or {})
        #: a local index keeps its checkpoint inside; a remote one gets a scratch one per run
        self.checkpoint: Path | None = self.root / "checkpoint" if self.root is not None else None
        self._batch_base = 0          # manifest batch id of Spark's batch 0 (remote: counted on)
        self._start_offset: dict[str, Any] | None = None
        self.report = RunReport()
        self._stopped = False
        self.on_batch = on_batch

    #: the run loop's clock and pause (a test drives them)
    _clock = staticmethod(time.monotonic)
    _sleep = staticmethod(time.sleep)

    # ------------------------------------------------------------------ public
    def run(self, follow: bool = False, interval_s: float = 5.0, timeout_s: float | None = None,
            stop: Callable[[], bool] | None = None, unavailable_wait_s: float = UNAVAILABLE_WAIT_S) -> RunReport:
        """Bring the index up to date (AvailableNow), or with ``follow`` keep it updated.

        ``stop`` is polled while the query runs; when it returns True the query is stopped
        between Spark calls (a signal handler only sets a flag: raising inside a blocked py4j
        call would break the gateway and print its tracebacks).

        A one-shot run whose query ended with partitions that had no live active node (a cluster
        mid-failover) runs again, from where it stopped, until every partition was served or
        ``unavailable_wait_s`` passed since a run first ended so: it returns up to date, or with
        ``report.unavailable`` naming what is still unserved (a follow run takes them up at a later
        trigger instead).  WHY from then and not from the start: the first run may itself take
        longer than the wait (a loaded machine, a large index), and would then never be followed
        by the run that reads the moved partitions."""
        started = self._clock()
        unserved_since: float | None = None
        total = RunReport()
        while True:
            report = self._run_once(follow, interval_s, timeout_s, stop)
            total.merge(report)
            if follow or self._stopped or not report.unavailable:
                break
            now = self._clock()
            if unserved_since is None:
                unserved_since = now
            if now - unserved_since >= unavailable_wait_s:
                break
            if timeout_s is not None:
                timeout_s -= report.seconds
                if timeout_s <= 0:
                    break
            log.warning("index run: %d partition(s) had no live active node (%s); running again",
                        len(report.unavailable), ", ".join(map(str, sorted(report.unavailable))))
            self._sleep(UNAVAILABLE_RETRY_S)
        total.seconds = self._clock() - started
        self.report = total
        return total

    def _run_once(self, follow: bool, interval_s: float, timeout_s: float | None,
                  stop: Callable[[], bool] | None) -> RunReport:
        from .. import session
        session.register(self.spark)
        started = time.monotonic()
        self.report = RunReport()
        self._stopped = False
        manifest = self._open()
        collect_garbage(self.where, manifest)
        opts = {"server": self.server, "startingOffsets": "earliest", **self.source_options}
        scratch = None
        if self.root is None:
            scratch = Path(tempfile.mkdtemp(prefix="upr-index-checkpoint-"))
            self.checkpoint = scratch / "checkpoint"
            self._batch_base = manifest.batch_id + 1
            self._start_offset = manifest.offset if manifest.offset and not manifest.offset.get("latest") else None
            if self._start_offset is not None:
                opts["startingOffsets"] = json.dumps(self._start_offset)
        if self.token:
            opts["token"] = self.token
        from ..options import parse_options
        from ..rows import SCHEMA_DDL
        parse_options(opts)   # fail here, naming the option; the explicit schema skips a Python round trip
        df = self.spark.readStream.format("upr").options(**opts).schema(SCHEMA_DDL).load()
        writer = (df.writeStream.foreachBatch(self._apply)
                  .option("checkpointLocation", str(self.checkpoint))
                  .queryName(f"upr-index-{os.path.basename(self.where.base.rstrip('/')) or 'index'}"))
        writer = writer.trigger(processingTime=f"{interval_s} seconds") if follow else writer.trigger(availableNow=True)
        self._t_started = time.monotonic()
        self._t_applied: float | None = None
        try:
            query = writer.start()
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            stopped = False
            try:
                while not query.awaitTermination(0.5):
                    stopped = stop is not None and stop()
                    if stopped or (deadline is not None and time.monotonic() >= deadline):
                        break
            finally:
                self.report.unavailable = _unavailable(query.lastProgress)
                self._stopped = stopped
                if query.isActive:
                    query.stop()
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        if self._t_applied is not None:
            self.report._add("query end", self._t_applied)
        exc = query.exception()
        if exc is not None and not stopped:
            raise exc
        if exc is not None:
            # Ctrl-C reaches Spark's Python workers too (they restore Python's SIGINT handler), so
            # a task running at that moment fails; the stop was asked for, and the manifest names
            # the last batch applied whole.
            log.info("query ended by the requested stop: %s", exc)
        final = load(self.where)
        self.report.generation = final.generation if final else 0
        self.report.seconds = time.monotonic() - started
        return self.report

    def manifest(self) -> Manifest | None:
        return load(self.where)

    # ------------------------------------------------------------------ internals
    def _open(self) -> Manifest:
        self.where.make_dir("")
        manifest = load(self.where)
        name = self.where.display()
        if manifest is None:
            # No committed generation: whatever checkpoint exists belongs to a build that never
            # committed, so start the full build from scratch.
            if self.checkpoint is not None and self.checkpoint.exists():
                shutil.rmtree(self.checkpoint)
            manifest = Manifest(0, -1, self.spec, self.server, node_id=self._node_id())
            commit(self.where, manifest)
            return manifest
        if manifest.spec != self.spec:
            raise IndexError_(f"{name} was built with {manifest.spec}, not {self.spec}; "
                              "use another directory for another index")
        node_id = self._node_id()
        if manifest.node_id and node_id != manifest.node_id and CLUSTER_KEYSPACE not in (node_id, manifest.node_id):
            raise IndexError_(f"{name} follows the keyspace of node {manifest.node_id} "
                              f"({manifest.server}); {self.server} serves node {node_id}")
        if manifest.server != self.server or manifest.node_id != node_id:
            # same keyspace at a new address, or a server that joined a cluster (or left one):
            # the failover logs decide per partition whether its history is still the index's
            manifest = replace(manifest, server=self.server, node_id=node_id)
            commit(self.where, manifest)
        return manifest

    def _node_id(self) -> str:
        """The keyspace the index follows: a single server's data-dir id, or ``CLUSTER_KEYSPACE``
        for a cluster, whichever of the named nodes answers (a cluster has no id of its own and
        each node's store has its own; a foreign or recreated history is met per partition by
        the rollback rules instead, as the backup client does)."""
        from ..meta import get_json, read_map
        from ..options import OptionError, parse_options
        from ..retry import Retryable, call_with_retries
        opts = parse_options({"server": self.server, **({"token": self.token} if self.token else {})})
        server, view = call_with_retries(f"GET /cluster from {self.server}",
                                         lambda: read_map(opts.seeds, opts.token, opts.timeout), opts.retry)
        if view is not None:
            return CLUSTER_KEYSPACE
        try:
            return str(get_json(server, "/status", opts.token, opts.timeout).get("node_id", ""))
        except (OptionError, Retryable) as exc:
            raise IndexError_(f"{self.server}: cannot read the server's status: {exc}") from None

    def _batch_offset(self, batch_id: int) -> dict[str, Any] | None:
        """The end offset of Spark batch ``batch_id`` from the checkpoint (-1: the query's start
        offset when it began from a manifest's, else None)."""
        if batch_id < 0:
            return self._start_offset
        assert self.checkpoint is not None
        path = self.checkpoint / "offsets" / str(batch_id)
        try:
            lines = path.read_text().splitlines()
            return json.loads(lines[2])
        except (OSError, IndexError, ValueError):
            return None

    def _planned_seqnos(self, batch_id: int) -> int | None:
        """Seqnos the batch spans, from its start and end offsets in the checkpoint (a partition
        whose rollback generation moved is restreamed from 0); None if they cannot be read."""
        start, end = self._batch_offset(batch_id - 1), self._batch_offset(batch_id)
        try:
            ends = end["p"]                                  # type: ignore[index]
            starts = start["p"] if start else {}             # type: ignore[index]
            total = 0
            for p, e in ends.items():
                s = starts.get(p)
                total += max(0, int(e["s"]) - (int(s["s"]) if s and s.get("g") == e.get("g") else 0))
            return total
        except (KeyError, TypeError, ValueError):
            return None

    def _apply(self, df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        if self._t_applied is None:   # query start: source process, offset log, planning
            self.report._add("query start", self._t_started)
        try:
            self._apply_(df, batch_id)
        finally:
            self._t_applied = time.monotonic()

    def _apply_(self, df, spark_batch: int) -> None:  # type: ignore[no-untyped-def]
        manifest = load(self.where)
        assert manifest is not None
        batch_id = self._batch_base + spark_batch
        if batch_id <= manifest.batch_id:
            self.report.skipped += 1
            return
        t = started = time.monotonic()
        run_path = f"runs/r-{manifest.generation + 1:06d}-{batch_id}-{uuidlib.uuid4().hex[:8]}"
        planned = self._planned_seqnos(spark_batch)
        small = planned is not None and planned <= self.local_batch_rows
        in_task = "minpartitions" not in {k.lower() for k in self.source_options}
        sc = self.spark.sparkContext
        changes = sc.accumulator(0)
        controls_acc = sc.accumulator([], ListParam())
        entries = df.mapInArrow(entries_fn(self.function, in_task, changes, controls_acc), STAGED_SCHEMA)
        if not in_task:   # split partitions: a key's versions may sit in two tasks
            entries = _newest_per_key(entries)
        entries = entries.select("value", "key", "partition", "seqno")
        if small:
            # A small batch's index rows (never its document values) come to the driver and are
            # written there: no Spark write job (its planning and commit protocol are fixed costs).
            write_entries(self.where, run_path, entries.toArrow().to_batches())
        else:
            write_frame(entries, self.where, run_path)
        t = self.report._add("read+write", t)
        self.report.rows_read += changes.value
        controls = set(controls_acc.value)
        resets = sorted({p for p, op, _ in controls if op == "reset"})
        rollbacks: dict[int, int] = {}
        for p, op, seqno in controls:
            if op == "rollback":
                rollbacks[p] = min(seqno, rollbacks.get(p, seqno))
        end_offset = self._batch_offset(spark_batch)
        if not changes.value and not controls and _same_seqnos(end_offset, manifest.offset):
            # Nothing read and no position moved (a query started from the manifest's offset
            # may restate it with its snapshot closed): no generation for an empty run.
            self.where.remove_dir(run_path)
            return
        runs = manifest.runs + (seal_run(self.where, run_path, tuple(resets), first=not manifest.runs),)
        t = self.report._add("sidecar", t)
        if rollbacks:
            # The keys whose rows came from the lost history, re-read by GET: a later run, so the
            # current versions win over whatever the stream delivered in this batch.
            fixes = _newest_per_key(self._corrections(manifest, rollbacks).mapInArrow(
                entries_fn(self.function), STAGED_SCHEMA))
            fix_path = run_path.replace("/r-", "/f-")
            write_frame(fixes.select("value", "key", "partition", "seqno"), self.where, fix_path)
            runs += (seal_run(self.where, fix_path),)
            t = self.report._add("refetch", t)
        nxt = manifest.next(batch_id=batch_id, runs=runs, offset=end_offset)
        if len(runs) > self.max_runs:
            nxt = self._compact(nxt)
            t = self.report._add("compact", t)
        commit(self.where, nxt)
        t = self.report._add("commit", t)
        if self.on_batch is not None:
            from ..offsets import SourceOffset
            seqnos = ({p: o.seqno for p, o in SourceOffset.from_json(nxt.offset).partitions.items()}
                      if nxt.offset and not nxt.offset.get("latest") else {})
            self.on_batch(BatchProgress(batch_id, changes.value, seqnos, time.monotonic() - started, nxt.generation,
                                        tuple(resets)))
        self.report.batches += 1
        self.report.resets.extend(resets)
        self.report.rollbacks.update(rollbacks)

    def _corrections(self, manifest: Manifest, rollbacks: dict[int, int]):  # type: ignore[no-untyped-def]
        from pyspark.sql import functions as F
        cond = None
        for p, r in rollbacks.items():
            c = (F.col("partition") == p) & (F.col("seqno") > r)
            cond = c if cond is None else cond | c
        suspects = (runs_frame(self.spark, self.where, manifest, markers=True).filter(cond)
                    .select("key", "partition").distinct().collect())
        rows = refetch(self.server, self.token, [(s.key, s.partition, rollbacks[s.partition]) for s in suspects])
        self.report.refetched += len(rows)
        return self.spark.createDataFrame(rows, "key STRING, partition INT, seqno BIGINT, op STRING, value BINARY")

    def _compact(self, manifest: Manifest, major: bool = False) -> Manifest:
        """Merge runs, so reads union few of them.

        Minor (the usual case): the runs after the first (the base) are merged into one, when they
        hold less than ``MINOR_FRACTION`` of the base's rows.  Its cost follows the changes since
        the last major compaction, not the index size: merging everything every ``max_runs``
        batches would rewrite the whole index once per four small incremental runs, a cost that
        grows with the index (see docs/benchmarks.md, Spark).  The merged run keeps the markers (they supersede base rows) and
        the union of the resets (they kill base rows of those partitions; within the merged runs
        ``runs_frame`` has applied them already).

        Major (``major``, or the changes have grown past the fraction): everything into one run,
        dropping the markers no rollback can need any more.  A marker (value NULL: a deleted or
        entry-less key) supersedes the key's rows in older runs, and lets ``refetch`` find the key
        when the server rolls back below it.  After a full merge there are no older runs, and a
        marker at or below its partition's purge seqno is in durable history (the server purges
        only persisted tombstones, and a position below the purge seqno rolls back to 0, where the
        restream delivers every live key), so those markers go; the rest stay.
        """
        base, deltas = manifest.runs[0], manifest.runs[1:]
        if not major and len(deltas) > 1 and sum(r.rows for r in deltas) < MINOR_FRACTION * base.rows:
            path = f"runs/m-{manifest.generation:06d}-{uuidlib.uuid4().hex[:8]}"
            if sum(r.rows for r in deltas) <= MERGE_IN_DRIVER_ROWS:
                merge_runs_locally(self.where, deltas, path)
            else:
                write_frame(runs_frame(self.spark, self.where, replace(manifest, runs=deltas), markers=True),
                            self.where, path)
            resets = tuple(sorted({p for r in deltas for p in r.resets}))
            return replace(manifest, runs=(base, seal_run(self.where, path, resets)))
        path = f"runs/c-{manifest.generation:06d}-{uuidlib.uuid4().hex[:8]}"
        frame = runs_frame(self.spark, self.where, manifest, markers=True)
        purged = self._purge_seqnos()
        if purged:
            from pyspark.sql import functions as F
            floor = F.create_map(*[F.lit(x) for p, s in sorted(purged.items()) for x in (p, s)])
            frame = frame.filter(F.col("value").isNotNull()
                                 | (F.col("seqno") > F.coalesce(floor[F.col("partition")], F.lit(0))))
        write_frame(frame, self.where, path)
        run = seal_run(self.where, path, first=True)
        return replace(manifest, runs=(run,), rows=run.rows)

    def _purge_seqnos(self) -> dict[int, int]:
        """Partitions whose purge seqno is above 0, each read from its active node (any of the
        named servers gives the map); a partition without a live active, or a server that cannot
        be reached, has none here, and compaction keeps all its markers (always correct)."""
        from ..meta import fetch_routed
        from ..options import OptionError, parse_options
        from ..retry import SourceUnavailable
        opts = parse_options({"server": self.server, **({"token": self.token} if self.token else {})})
        try:
            meta, _ = fetch_routed(opts, partial=True)
        except (OptionError, SourceUnavailable) as exc:
            log.warning("index compaction keeps every marker: %s", redact(str(exc)))
            return {}
        return {p: sp.purge_seqno for p, sp in meta.partitions.items() if sp.purge_seqno > 0}

    def compact(self) -> Manifest:
        """Merge every run into one now (a major compaction; e.g. after a full build with several
        batches, or to drop purged markers)."""
        manifest = self._open()
        if len(manifest.runs) <= 1:
            return manifest
        nxt = self._compact(manifest.next(), major=True)
        commit(self.where, nxt)
        collect_garbage(self.where, nxt)
        return nxt
