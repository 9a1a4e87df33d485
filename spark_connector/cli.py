"""``upr index run|query|info``: incremental secondary indexes built by Spark from the change feed.

Registered into the ``upr`` root CLI (``app/cli.py`` imports this module lazily).  Also runnable
alone: ``python -m spark_connector.cli index run ...``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence

TYPE_CHECKING = False   # typing only for the checkers: `upr index query` imports this module (docs/benchmarks.md)
if TYPE_CHECKING:
    from typing import Any


EXIT_ERROR = 1
EXIT_USAGE = 2


def register(sub: Any) -> None:
    p = sub.add_parser("index", help="build, update and query Spark secondary indexes",
                       description="Secondary indexes on a JSON field, built by Spark from the change feed. "
                                   "The first run is a full build; later runs read only the changes since.")
    isub = p.add_subparsers(dest="index_cmd", required=True)

    r = isub.add_parser("run", help="build or incrementally update an index (Trigger.AvailableNow)")
    r.add_argument("--server", default=None, help="server URL (default $UPR_SERVER or the local default)")
    r.add_argument("--token", default=None, help="bearer token (default $UPR_TOKEN)")
    r.add_argument("--index", required=True, metavar="DIR", help="index directory (manifest, runs, checkpoint)")
    r.add_argument("--field", required=True, metavar="PATH", help="JSON field path to index, e.g. address.city")
    r.add_argument("--spark-master", default="local[*,4]",
                   help="Spark master: local[N,F], spark://HOST:PORT, yarn, k8s://... (default %(default)s)")
    r.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", type=_conf_pair,
                   help="a Spark conf, repeatable (e.g. --conf spark.executor.instances=4)")
    r.add_argument("--executor-memory", metavar="SIZE", help="spark.executor.memory, e.g. 2g")
    r.add_argument("--executor-cores", type=int, metavar="N", help="spark.executor.cores")
    r.add_argument("--executor-env", metavar="DIR|ARCHIVE",
                   help="the executors' Python environment (built by `upr index env`): a directory at the "
                        "same path on every host, or a .tar.gz shipped with spark.archives "
                        "(default: this interpreter, right for local masters and identical hosts)")
    r.add_argument("--min-partitions", type=int, default=None, metavar="N",
                   help="Spark tasks to aim for per batch (the source's minPartitions)")
    r.add_argument("--follow", action="store_true", help="keep running as a streaming query")
    r.add_argument("--interval", type=float, default=5.0, metavar="S", help="--follow trigger interval (s)")
    r.add_argument("--max-offsets-per-trigger", type=int, default=None, metavar="N",
                   help="rows per micro-batch (default: all available in one batch)")
    r.add_argument("--on-rollback", choices=["fail", "resetPartition", "refetch"], default="resetPartition",
                   help="what to do when the server's history branched (default %(default)s)")
    r.add_argument("--max-runs", type=int, default=4, metavar="N", help="compact above N runs (default 4)")
    r.add_argument("--debug", action="store_true", help="on failure, print the full trace and Spark's log")
    r.set_defaults(func=_guard(_cmd_run))

    e = isub.add_parser("env", help="build the executors' Python environment from this project's wheel",
                        description="A venv with this project's wheel for Spark's executors, for "
                                    "`upr index run --executor-env`; --pack also writes it as a .tar.gz "
                                    "for spark.archives.")
    e.add_argument("--out", required=True, metavar="DIR", help="new directory for the venv")
    e.add_argument("--pack", metavar="FILE.tar.gz", help="also pack the venv into this archive")
    e.add_argument("--deps", choices=["install", "inherit"], default="install",
                   help="install: dependencies from the package index (default); inherit: reuse this "
                        "interpreter's site-packages by path (hosts with the same image, no index)")
    e.add_argument("--debug", action="store_true", help="on failure, print the full trace")
    e.set_defaults(func=_guard(_cmd_env))

    q = isub.add_parser("query", help="print the keys whose field has the given value")
    q.add_argument("--index", required=True, metavar="DIR|URI", help="index path or URI (file://, hdfs://, s3://, ...)")
    q.add_argument("--value", required=True, help="field value (strings as-is, other JSON scalars as JSON text)")
    q.add_argument("--spark", action="store_true",
                   help="scan with Spark (large scans); by default pyarrow reads the Parquet runs, no JVM")
    q.add_argument("--spark-master", default="local[*]", help="with --spark (default %(default)s)")
    q.add_argument("--json", action="store_true", help="one JSON object per match")
    q.add_argument("--debug", action="store_true", help="on failure, print the full trace")
    q.set_defaults(func=_guard(_cmd_query))

    i = isub.add_parser("info", help="generations, per-partition seqnos and lag behind the server")
    i.add_argument("--index", required=True, metavar="DIR|URI")
    i.add_argument("--server", default=None, help="server URL for the lag (default: the index's server)")
    i.add_argument("--token", default=None, help="bearer token (default $UPR_TOKEN)")
    i.add_argument("--json", action="store_true")
    i.add_argument("--debug", action="store_true", help="on failure, print the full trace")
    i.set_defaults(func=_guard(_cmd_info))


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def spark_confs(args: argparse.Namespace) -> dict[str, str]:
    """The Spark confs ``upr index run`` passes: --conf pairs, then the named flags (which win)."""
    confs = dict(args.conf)
    if args.executor_memory:
        confs["spark.executor.memory"] = args.executor_memory
    if args.executor_cores:
        confs["spark.executor.cores"] = str(args.executor_cores)
    return confs


def _guard(fn):  # type: ignore[no-untyped-def]
    """Every failure ends in one line on stderr and a non-zero exit; ``--debug`` adds the trace.

    Expected failures (bad input, a missing index, a refused rollback) are typed; anything else
    raised inside a Spark query arrives wrapped by py4j and the JVM, and ``failures.one_line``
    digs out its cause."""
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except _expected_errors() as exc:
            if getattr(args, "debug", False):
                _print_trace()
            from .redact import redact
            print(f"upr index: {redact(str(exc))}", file=sys.stderr)
            return EXIT_ERROR
        except KeyboardInterrupt:
            print("upr index: interrupted", file=sys.stderr)
            return 130
        except ModuleNotFoundError:
            raise           # app/cli.py names the extra to install
        except Exception as exc:  # noqa: BLE001 - Spark's wrapped failures: the cause in one line
            if getattr(args, "debug", False):
                _print_trace()
            from .failures import one_line
            print(f"upr index: {one_line(exc)}", file=sys.stderr)
            return EXIT_ERROR
    return run


def _print_trace() -> None:
    """``--debug``: the whole traceback, without the credentials of the URIs it quotes."""
    import traceback

    from .redact import redact
    print(redact(traceback.format_exc()), file=sys.stderr, end="")


def _expected_errors() -> tuple[type[BaseException], ...]:
    """The typed failures ``_guard`` reports as they are.  Imported only once something failed
    (an ``except`` clause evaluates its types then): a lookup should not pay for the modules
    that define them."""
    from engine.core.errors import UprError

    from .executor_env import EnvError
    from .index.errors import IndexError_
    return (UprError, IndexError_, EnvError, FileNotFoundError, ValueError)


class _StopRequest:
    """SIGINT/SIGTERM while a query runs: remember the signal, let the job stop the query
    between Spark calls, and exit 130 (SIGINT, the shell's convention) or 0 (SIGTERM: a
    requested, clean stop)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            print("upr index: stopping the query ...", file=sys.stderr, flush=True)
        self.signum = signum

    def requested(self) -> bool:
        return self.signum is not None

    def exit_code(self) -> int:
        import signal
        return 130 if self.signum == signal.SIGINT else 0

    def install(self) -> dict[int, Any]:
        import signal
        return {sig: signal.signal(sig, self) for sig in (signal.SIGINT, signal.SIGTERM)}


def batch_line(progress: Any, highs: dict[int, int] | None) -> str:
    """What ``--follow`` prints per applied batch: changes, lag behind the server, time."""
    lag = "lag ?" if highs is None else \
        f"lag {sum(max(0, h - progress.seqnos.get(p, 0)) for p, h in highs.items())} seqnos"
    resets = f", reset partitions {list(progress.resets)}" if progress.resets else ""
    return (f"batch {progress.batch_id}: {progress.changes} change(s), {lag}, {progress.seconds:.1f}s "
            f"(generation {progress.generation}){resets}")


def _server_highs(server: str, token: str | None) -> dict[int, int] | None:
    from clients.errors import ClientError
    from clients.http import HttpApi
    try:
        with HttpApi(server, token, timeout=5.0) as api:
            return {int(p["partition"]): int(p["high_seqno"]) for p in api.partitions()}
    except (ClientError, OSError):
        return None


def _with_client_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill --server/--token from the environment here, not at parser build time: importing the
    client package costs a JVM-free ``upr index query`` more than its lookup."""
    from clients.http import default_server, default_token
    if getattr(args, "server", "unset") is None and args.index_cmd == "run":
        args.server = default_server()
    if getattr(args, "token", "unset") is None:
        args.token = default_token()
    return args


def _cmd_run(args: argparse.Namespace) -> int:
    import signal

    _with_client_defaults(args)

    from .index.functions import FieldIndex
    from .index.job import IndexJob
    from .options import parse_options
    from .session import local_session

    opts = {"onRollback": args.on_rollback}
    if args.max_offsets_per_trigger:
        opts["maxOffsetsPerTrigger"] = str(args.max_offsets_per_trigger)
    if args.min_partitions:
        opts["minPartitions"] = str(args.min_partitions)
    parse_options({"server": args.server, **opts})     # bad flags fail before the JVM starts
    function = FieldIndex(args.field)
    if args.executor_env and not (os.path.exists(args.executor_env) or "://" in args.executor_env):
        raise FileNotFoundError(f"--executor-env {args.executor_env}: no such directory or archive "
                                "(build one with `upr index env --out DIR`)")
    stop = _StopRequest()
    previous = stop.install()
    try:
        spark = local_session(args.spark_master, app_name="upr-index", extra=spark_confs(args),
                              executor_env=args.executor_env)
        # SparkContext installs its own SIGINT handler (cancel every job, raise KeyboardInterrupt
        # in whatever py4j call is running: the gateway's tracebacks); the stop request wins
        signal.signal(signal.SIGINT, stop)
        if not args.debug:      # failures are reported in one line below, not by Spark's logger
            spark.sparkContext.setLogLevel("OFF")

        def on_batch(progress: Any) -> None:
            if args.follow:
                print(batch_line(progress, _server_highs(args.server, args.token)), flush=True)
        try:
            job = IndexJob(spark, args.index, args.server, function, token=args.token, max_runs=args.max_runs,
                           source_options=opts, on_batch=on_batch)
            report = job.run(follow=args.follow, interval_s=args.interval, stop=stop.requested)
        finally:
            spark.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    from .redact import redact
    print(f"index {redact(args.index)}: generation {report.generation}, {report.batches} batch(es), "
          f"{report.rows_read} change(s) read in {report.seconds:.1f}s"
          + (f", reset partitions {sorted(set(report.resets))}" if report.resets else "")
          + (f", rolled back {report.rollbacks} ({report.refetched} keys refetched)" if report.rollbacks else "")
          + (f", partitions {sorted(report.unavailable)} left behind: no live active node "
             f"({report.unavailable[min(report.unavailable)]}; the next run takes them up)"
             if report.unavailable else "")
          + (" (stopped by signal)" if stop.requested() else ""), flush=True)
    return stop.exit_code() if stop.requested() else 0


def _cmd_env(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from .executor_env import EnvError, build_env, build_wheel, pack

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):     # before minutes of building, not after
        raise EnvError(f"{out} exists and is not empty; choose a new directory")
    with tempfile.TemporaryDirectory(prefix="upr-wheel-") as tmp:
        print("building the upr wheel ...", file=sys.stderr)
        wheel = build_wheel(Path(tmp))
        print(f"creating {out} ({args.deps} dependencies) ...", file=sys.stderr)
        python = build_env(out, wheel, deps=args.deps)
    print(f"executor environment: {out} (python {python})")
    if args.pack:
        print(f"archive for spark.archives: {pack(out, Path(args.pack))}")
    return 0


def query(spark, index_dir: str, value: str) -> list[Any]:  # type: ignore[no-untyped-def]
    """Rows (key, partition, seqno) of the index entries equal to ``value``, ordered by key."""
    from pyspark.sql import functions as F

    from .index.view import load_index
    return (load_index(spark, index_dir).filter(F.col("value") == value)
            .select("key", "partition", "seqno").orderBy("key").collect())


@contextlib.contextmanager
def _pyarrow_without_numpy() -> Iterator[None]:
    """Load pyarrow without NumPy for a one-shot lookup, when neither is loaded yet.

    pyarrow runs without NumPy (an optional dependency of it since 16.0) and a lookup converts
    only strings and integers; importing NumPy is a third of a new ``upr index query``
    process's CPU (docs/benchmarks.md, index point lookups).  The block is lifted afterwards,
    but pyarrow stays loaded without NumPy in this process: a longer-lived caller of ``main``
    that needs pyarrow's NumPy conversions imports NumPy first (then nothing is blocked)."""
    if "pyarrow" in sys.modules or "numpy" in sys.modules:
        yield
        return
    sys.modules["numpy"] = None  # type: ignore[assignment]   # makes "import numpy" fail fast
    try:
        yield
    finally:
        if sys.modules.get("numpy", 0) is None:
            del sys.modules["numpy"]


def _cmd_query(args: argparse.Namespace) -> int:
    if args.spark:
        from .session import local_session
        spark = local_session(args.spark_master, app_name="upr-index-query")
        try:
            rows = [{"key": r.key, "partition": r.partition, "seqno": r.seqno}
                    for r in query(spark, args.index, args.value)]
        finally:
            spark.stop()
    else:
        with _pyarrow_without_numpy():
            from .index.lookup import lookup
            rows = lookup(args.index, args.value)
    lines = [json.dumps(row) for row in rows] if args.json else [row["key"] for row in rows]
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


def info(index_dir: str, server: str | None = None, token: str | None = None) -> dict[str, Any]:
    """What ``upr index info`` prints: no Spark needed (manifest and history files only)."""
    from .index.manifest import load
    from .offsets import SourceOffset

    from .index.storage import open_location
    from .redact import redact

    where = open_location(index_dir)
    manifest = load(where)
    if manifest is None:
        raise FileNotFoundError(f"{redact(index_dir)}: no index here (manifest.json missing)")
    history = [n for n in where.list_dir("history") if n.endswith(".json")]
    seqnos: dict[int, int] = {}
    if manifest.offset and not manifest.offset.get("latest"):
        seqnos = {p: o.seqno for p, o in SourceOffset.from_json(manifest.offset).partitions.items()}
    out: dict[str, Any] = {
        "index": redact(index_dir), "spec": manifest.spec, "server": manifest.server,
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
            out["lag_error"] = redact(str(exc))
    return out


def _cmd_info(args: argparse.Namespace) -> int:
    _with_client_defaults(args)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="upr")
    register(parser.add_subparsers(dest="cmd", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
