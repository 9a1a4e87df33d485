"""The PYSPARK_PYTHON wrapper drops only the zipped copy of an *installed* pyspark from PYTHONPATH."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spark_connector.session import SPARK_PYTHON


def _run(pythonpath: str) -> str:
    env = {**os.environ, "PYTHONPATH": pythonpath, "UPR_SPARK_PYTHON": sys.executable}
    out = subprocess.run([str(SPARK_PYTHON), "-c", "import os; print(os.environ['PYTHONPATH'])"],
                         env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def test_wrapper_drops_installed_pyspark_zips_and_keeps_everything_else(tmp_path: Path):
    installed = tmp_path / "site" / "pyspark"
    (installed / "python" / "lib").mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    zips = [str(installed / "python" / "lib" / "pyspark.zip"),
            str(installed / "python" / "lib" / "py4j-0.10.9.9-src.zip")]
    dist = str(tmp_path / "spark-dist" / "python" / "lib" / "pyspark.zip")   # a Spark distribution: kept
    other = str(tmp_path / "a b*")                                          # spaces and globs survive
    assert _run(":".join([*zips, "/x/core.jar", dist, other])) == ":".join(["/x/core.jar", dist, other])
    assert _run("") == ""
