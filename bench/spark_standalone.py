"""A Spark standalone master and one worker on 127.0.0.1, from the installed pyspark, for benches.

``spark-class`` with ``SPARK_NO_DAEMONIZE`` and ephemeral ports; the worker gets ``--cores`` cores and
its own work dir.  ``tests/spark/test_standalone_cluster.py`` runs its cluster test on it too.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _daemon(log: Path, spark_home: Path, *args: str) -> subprocess.Popen[bytes]:
    # a worker host knows nothing of the driver's checkout: without PYTHONPATH, executors cannot
    # import the project from the caller's tree instead of the environment shipped to them
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("PYSPARK_", "UPR_"))}
    env.update(SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    with open(log, "wb") as out:
        return subprocess.Popen([str(spark_home / "bin" / "spark-class"), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait(proc: subprocess.Popen[bytes], log: Path, pattern: str, timeout: float = 180) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found:
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name} exited:\n{log.read_text()[-2000:]}")
        time.sleep(0.3)
    raise RuntimeError(f"no {pattern!r} in {log.name} within {timeout} s")


@contextmanager
def standalone_cluster(work: Path, cores: int = 2, memory: str = "2g") -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a master with one registered worker; both killed on exit."""
    spark_home = Path(__import__("pyspark").__file__).parent
    work.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master = _daemon(work / "master.log", spark_home, "org.apache.spark.deploy.master.Master",
                         "--host", "127.0.0.1", "--port", "0", "--webui-port", "0")
        procs.append(master)
        url = _wait(master, work / "master.log", r"Starting Spark master at (spark://[\d.]+:\d+)").group(1)
        worker = _daemon(work / "worker.log", spark_home, "org.apache.spark.deploy.worker.Worker", url,
                         "--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--cores", str(cores),
                         "--memory", memory, "--work-dir", str(work / "worker"))
        procs.append(worker)
        _wait(worker, work / "worker.log", r"Successfully registered with master")
        yield url
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
