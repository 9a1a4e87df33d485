"""The driver process of tests/spark/test_standalone_cluster.py (one JVM for both steps).

The session comes from ``local_session`` with the confs ``upr index run --executor-env ENV
--executor-cores 2 --executor-memory 512m`` passes (one application, so one set of executors:
the cluster's fixed cost is paid once), then:

1. an index build (``IndexJob``, what ``upr index run`` runs) against the standalone master;
2. a streaming query with the ``upr`` source (AvailableNow) whose batches also report, from the
   executors, which interpreter ran the tasks and where they imported the connector from;
3. with an ARCHIVE argument (``upr index env --pack``): a second application in the same JVM
   whose executors get the environment through ``spark.archives`` (``--executor-env FILE``),
   reads the source once and reports the same probe.

Prints one JSON line: {"generation", "rows", "executors": [[sys.executable, spark_connector file], ...],
"archive_rows", "archive_executors"}.
"""
from __future__ import annotations

import json
import os
import sys


def probe(batches):  # type: ignore[no-untyped-def]
    import sys as _sys

    import pyarrow as pa

    import spark_connector
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"python": [_sys.executable], "module": [spark_connector.__file__]})


def main() -> None:
    master, env, server, index_dir, checkpoint = sys.argv[1:6]
    archive = sys.argv[6] if len(sys.argv) > 6 else None
    from spark_connector.cli import build_parser, spark_confs
    from spark_connector.index.functions import FieldIndex
    from spark_connector.index.job import IndexJob
    from spark_connector.rows import SCHEMA_DDL
    from spark_connector.session import local_session

    # the executors get the tests' short-lived-JVM options too (tests/conftest.py)
    jvm = ["--conf", f"spark.executor.extraJavaOptions={os.environ['SPARK_SUBMIT_OPTS']}"] \
        if os.environ.get("SPARK_SUBMIT_OPTS") else []
    args = build_parser().parse_args(
        ["index", "run", "--server", server, "--index", index_dir, "--field", "city", "--spark-master", master,
         "--executor-env", env, "--executor-memory", "512m", "--executor-cores", "2",
         "--conf", "spark.cores.max=2", "--min-partitions", "2", *jvm])
    spark = local_session(args.spark_master, app_name="upr-standalone-test", shuffle_partitions=2,
                          extra=spark_confs(args), executor_env=args.executor_env)
    report = IndexJob(spark, index_dir, server, FieldIndex("city"),
                      source_options={"minPartitions": str(args.min_partitions)}).run()
    seen: dict[str, object] = {"rows": 0, "executors": set()}

    def each(df, batch_id):  # type: ignore[no-untyped-def]
        df = df.persist()
        seen["rows"] = int(seen["rows"]) + df.filter("key IS NOT NULL").count()
        for r in df.mapInArrow(probe, "python STRING, module STRING").collect():
            seen["executors"].add((r.python, r.module))  # type: ignore[union-attr]
        df.unpersist()

    df = spark.readStream.format("upr").option("server", server).option("startingOffsets", "earliest") \
        .option("minPartitions", "2").schema(SCHEMA_DDL).load()
    query = df.writeStream.foreachBatch(each).option("checkpointLocation", checkpoint) \
        .trigger(availableNow=True).start()
    query.awaitTermination(180)
    spark.stop()
    out = {"generation": report.generation, "rows": seen["rows"], "executors": sorted(seen["executors"])}
    if archive:
        # client mode: the driver's own Python processes run ./upr_env/bin/python too, so the
        # archive is unpacked here as well (docs/architecture.md, Spark on a cluster)
        import tarfile
        with tarfile.open(archive) as tar:
            tar.extractall("upr_env", filter="tar")
        args = build_parser().parse_args(
            ["index", "run", "--server", server, "--index", index_dir, "--field", "city", "--spark-master", master,
             "--executor-env", archive, "--executor-memory", "512m", "--executor-cores", "2",
             "--conf", "spark.cores.max=2", *jvm])
        spark = local_session(args.spark_master, app_name="upr-standalone-archive", shuffle_partitions=2,
                              extra=spark_confs(args), executor_env=args.executor_env)
        df = spark.read.format("upr").option("server", server).option("minPartitions", "2").load().persist()
        out["archive_rows"] = df.filter("key IS NOT NULL").count()
        out["archive_executors"] = sorted({(r.python, r.module) for r in
                                           df.mapInArrow(probe, "python STRING, module STRING").collect()})
        spark.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
