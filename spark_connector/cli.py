"""``upr index run|query|info``: incremental secondary indexes built by Spark from the change feed.

Registered into the ``upr`` root CLI (``app/cli.py`` imports this module lazily).  Also runnable
alone: ``python -m spark_connector.cli index run ...``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from clients.http import default_server, default_token

EXIT_ERROR = 1
EXIT_USAGE = 2


def register(sub: Any) -> None:
    p = sub.add_parser("index", help="build, update and query Spark secondary indexes",
                       description="Secondary indexes on a JSON field, built by Spark from the change feed. "
                                   "The first run is a full build; later runs read only the changes since.")
    isub = p.add_subparsers(dest="index_cmd", required=True)

    r = isub.add_parser("run", help="build or incrementally update an index (Trigger.AvailableNow)")
    r.add_argument("--server", default=default_server(), help="server URL (default $UPR_SERVER or %(default)s)")
    r.add_argument("--token", default=default_token(), help="bearer token (default $UPR_TOKEN)")
    r.add_argument("--index", required=True, metavar="DIR", help="index directory (manifest, runs, checkpoint)")
    r.add_argument("--field", required=True, metavar="PATH", help="JSON field path to index, e.g. address.city")
    r.add_argument("--spark-master", default="local[*,4]", help="Spark master (default %(default)s)")
    r.add_argument("--follow", action="store_true", help="keep running as a streaming query")
    r.add_argument("--interval", type=float, default=5.0, metavar="S", help="--follow trigger interval (s)")
    r.add_argument("--max-offsets-per-trigger", type=int, default=None, metavar="N",
                   help="rows per micro-batch (default: all available in one batch)")
    r.add_argument("--on-rollback", choices=["fail", "resetPartition", "refetch"], default="resetPartition",
                   help="what to do when the server's history branched (default %(default)s)")
    r.add_argument("--max-runs", type=int, default=4, metavar="N", help="compact above N runs (default 4)")
    r.set_defaults(func=_guard(_cmd_run))

    q = isub.add_parser("query", help="print the keys whose field has the given value")
    q.add_argument("--index", required=True, metavar="DIR")
    q.add_argument("--value", required=True, help="field value (strings as-is, other JSON scalars as JSON text)")
    q.add_argument("--spark-master", default="local[*]")
    q.add_argument("--json", action="store_true", help="one JSON object per match")
    q.set_defaults(func=_guard(_cmd_query))

    i = isub.add_parser("info", help="generations, per-partition seqnos and lag behind the server")
    i.add_argument("--index", required=True, metavar="DIR")
    i.add_argument("--server", default=None, help="server URL for the lag (default: the index's server)")
    i.add_argument("--token", default=default_token())
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=_guard(_cmd_info))


def _guard(fn):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        from engine.core.errors import UprError

        from .index.manifest import IndexError_
        try:
            return fn(args)
        except (UprError, IndexError_, FileNotFoundError, ValueError) as exc:
            print(f"upr index: {exc}", file=sys.stderr)
            return EXIT_ERROR
    return run


def _cmd_run(args: argparse.Namespace) -> int:
    from .index.functions import FieldIndex
    from .index.job import IndexJob
    from .options import parse_options
    from .session import local_session

    opts = {"onRollback": args.on_rollback}
    if args.max_offsets_per_trigger:
        opts["maxOffsetsPerTrigger"] = str(args.max_offsets_per_trigger)
    parse_options({"server": args.server, **opts})     # bad flags fail before the JVM starts
    function = FieldIndex(args.field)
    spark = local_session(args.spark_master, app_name="upr-index")
    try:
        job = IndexJob(spark, args.index, args.server, function, token=args.token, max_runs=args.max_runs,
                       source_options=opts)
        report = job.run(follow=args.follow, interval_s=args.interval)
    finally:
        spark.stop()
    print(f"index {args.index}: generation {report.generation}, {report.batches} batch(es), "
          f"{report.rows_read} change(s) read in {report.seconds:.1f}s"
          + (f", reset partitions {sorted(set(report.resets))}" if report.resets else "")
          + (f", rolled back {report.rollbacks} ({report.refetched} keys refetched)" if report.rollbacks else ""))
    return 0


def query(spark, index_dir: str, value: str) -> list[Any]:  # type: ignore[no-untyped-def]
    """Rows (key, partition, seqno) of the index entries equal to ``value``, ordered by key."""
    from pyspark.sql import functions as F

    from .index.view import load_index
    return (load_index(spark, index_dir).filter(F.col("value") == value)
            .select("key", "partition", "seqno").orderBy("key").collect())


def _cmd_query(args: argparse.Namespace) -> int:
    from .session import local_session

    spark = local_session(args.spark_master, app_name="upr-index-query")
    try:
        rows = query(spark, args.index, args.value)
    finally:
        spark.stop()
    for row in rows:
        print(json.dumps({"key": row.key, "partition": row.partition, "seqno": row.seqno}) if args.json else row.key)
    return 0


def info(index_dir: str, server: str | None = None, token: str | None = None) -> dict[str, Any]:
    """What ``upr index info`` prints: no Spark needed (manifest and history files only)."""
    from .index.manifest import load
    from .offsets import SourceOffset

    manifest = load(index_dir)
    if manifest is None:
        raise FileNotFoundError(f"{index_dir}: no index here (manifest.json missing)")
    history = sorted(os.listdir(os.path.join(index_dir, "history"))) if os.path.isdir(
        os.path.join(index_dir, "history")) else []
    seqnos: dict[int, int] = {}
    if manifest.offset and not manifest.offset.get("latest"):
        seqnos = {p: o.seqno for p, o in SourceOffset.from_json(manifest.offset).partitions.items()}
    out: dict[str, Any] = {
        "index": index_dir, "spec": manifest.spec, "server": manifest.server,
        "generation": manifest.generation, "batch_id": manifest.batch_id, "generations_kept": len(history),
        "runs": [{"path": r.path, "rows": r.rows, "resets": list(r.resets)} for r in manifest.runs],
        "seqnos": {str(p): s for p, s in sorted(seqnos.items())},
    }
    if server is not False:
        from clients.errors import ClientError
        from clients.http import HttpApi
        try:
            with HttpApi(server or manifest.server, token) as api:
                highs = {int(p["partition"]): int(p["high_seqno"]) for p in api.partitions()}
            out["lag"] = {str(p): max(0, h - seqnos.get(p, 0)) for p, h in sorted(highs.items())}
            out["lag_total"] = sum(out["lag"].values())
        except ClientError as exc:
            out["lag_error"] = str(exc)
    return out


def _cmd_info(args: argparse.Namespace) -> int:
    data = info(args.index, args.server, args.token)
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"index {data['index']}  {data['spec']}  server {data['server']}")
    print(f"generation {data['generation']} (batch {data['batch_id']}), {data['generations_kept']} manifests kept, "
          f"{len(data['runs'])} run(s), {sum(r['rows'] for r in data['runs'])} rows")
    lag = data.get("lag", {})
    for p, s in data["seqnos"].items():
        print(f"  partition {p:>4}: seqno {s:>10}" + (f"  lag {lag[p]}" if p in lag else ""))
    if "lag_total" in data:
        print(f"total lag: {data['lag_total']} seqnos")
    if "lag_error" in data:
        print(f"lag unknown: {data['lag_error']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="upr")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
