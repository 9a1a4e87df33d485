"""An embedded SparkSession with the settings the connector needs on one machine.

Why each setting (../shared/notes/spark.md §7): workers must run this interpreter (pyarrow and the
connector live in its venv), the driver should stay on loopback, the UI is noise for a job, and
streaming disables AQE so the 200 default shuffle partitions would cost 200 tasks per batch.
``local[N,F]`` lets a task be retried F-1 times (plain ``local[*]`` never retries).

Python processes run through ``spark_python.sh`` (when ``PYSPARK_PYTHON`` is not set already): it
takes the zipped copy of the pip-installed pyspark off their ``PYTHONPATH``, so they import the
installed, byte-compiled package instead of compiling its modules from the zip in every new
process (the driver's streaming-source process is new for every query; see docs/benchmarks.md,
Spark: the per-run cost notes).  Other masters get the Python that ``executor_env.python_for``
chooses: an executor environment built from this project's wheel (a directory at the same path on
every host, or an archive shipped with ``spark.archives``), else this interpreter by absolute path.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

#: PYSPARK_PYTHON wrapper: runs $UPR_SPARK_PYTHON without the pyspark.zip Spark prepends (see the script).
SPARK_PYTHON = Path(__file__).with_name("spark_python.sh")


def worker_python() -> str:
    """What Spark's Python processes should run: the wrapper around this interpreter if usable."""
    if os.name == "posix" and os.access(SPARK_PYTHON, os.X_OK):
        os.environ.setdefault("UPR_SPARK_PYTHON", sys.executable)
        return str(SPARK_PYTHON)
    return sys.executable


def local_session(master: str = "local[*,4]", app_name: str = "upr", shuffle_partitions: int = 4,
                  extra: dict[str, Any] | None = None, executor_env: str | None = None):  # type: ignore[no-untyped-def]
    """A SparkSession on ``master`` (any master, despite the name: ``local[*]`` is the default),
    with ``extra`` confs and, off the local machine, the Python of ``executor_env``."""
    from .executor_env import python_for

    wrapper = str(SPARK_PYTHON) if os.name == "posix" and os.access(SPARK_PYTHON, os.X_OK) else None
    choice = python_for(master, executor_env, this_python=sys.executable, wrapper=wrapper)
    current = os.environ.get("PYSPARK_PYTHON")
    # a user's own PYSPARK_PYTHON wins unless an environment is named; the wrapper a local
    # session of this process left there never serves another master
    if executor_env is not None or current is None or current == wrapper:
        os.environ["PYSPARK_PYTHON"] = choice.pyspark_python
    if choice.wrapped:
        os.environ.setdefault("UPR_SPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.python.worker.reuse", "true"))
    for key, value in {**choice.conf, **(extra or {})}.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def register(spark) -> None:  # type: ignore[no-untyped-def]
    """Make ``format("upr")`` available in this session."""
    from .source import UprDataSource
    spark.dataSource.register(UprDataSource)
