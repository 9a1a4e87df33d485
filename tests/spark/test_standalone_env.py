"""Which Python Spark's workers run for each master, and the confs ``upr index run`` passes (no JVM)."""
from __future__ import annotations

import pytest

from spark_connector.cli import build_parser, spark_confs
from spark_connector.executor_env import ARCHIVE_ALIAS, EnvError, build_env, is_local_master, python_for

HERE = "/venv/bin/python"
WRAP = "/pkg/spark_python.sh"


@pytest.mark.parametrize("master, env, python, conf, wrapped", [
    ("local[*,4]", None, WRAP, {}, True),                     # local: this interpreter, via the wrapper
    ("local", None, WRAP, {}, True),
    ("local-cluster[2,1,1024]", None, WRAP, {}, True),
    ("spark://h:7077", None, HERE, {}, False),               # never the wrapper off this machine
    ("yarn", None, HERE, {}, False),
    ("spark://h:7077", "/opt/upr-env", "/opt/upr-env/bin/python", {}, False),
    ("local[2]", "/opt/upr-env", "/opt/upr-env/bin/python", {}, False),   # an explicit env wins everywhere
    ("k8s://https://k:443", "/tmp/env.tar.gz", f"./{ARCHIVE_ALIAS}/bin/python",
     {"spark.archives": f"/tmp/env.tar.gz#{ARCHIVE_ALIAS}"}, False),
    ("yarn", "hdfs://nn/envs/upr.tgz", f"./{ARCHIVE_ALIAS}/bin/python",
     {"spark.archives": f"hdfs://nn/envs/upr.tgz#{ARCHIVE_ALIAS}"}, False),
])
def test_python_for_each_master(master, env, python, conf, wrapped):
    choice = python_for(master, env, this_python=HERE, wrapper=WRAP)
    assert (choice.pyspark_python, dict(choice.conf), choice.wrapped) == (python, conf, wrapped)


def test_without_a_wrapper_local_masters_run_this_interpreter():
    assert python_for("local[*]", None, this_python=HERE, wrapper=None).pyspark_python == HERE
    assert is_local_master("local[2,2]") and not is_local_master("spark://localhost:7077")


def test_index_run_flags_become_spark_confs_and_source_options():
    args = build_parser().parse_args(
        ["index", "run", "--index", "d", "--field", "f", "--spark-master", "spark://h:1",
         "--conf", "spark.executor.instances=3", "--conf", "spark.x=a=b", "--conf", "spark.executor.memory=1g",
         "--executor-memory", "2g", "--executor-cores", "2", "--min-partitions", "8"])
    assert spark_confs(args) == {"spark.executor.instances": "3", "spark.x": "a=b",
                                 "spark.executor.memory": "2g", "spark.executor.cores": "2"}
    assert args.min_partitions == 8 and args.spark_master == "spark://h:1"


@pytest.mark.parametrize("bad", ["novalue", "=x", " =x"])
def test_a_conf_without_key_and_value_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["index", "run", "--index", "d", "--field", "f", "--conf", bad])
    assert exc.value.code == 2 and "KEY=VALUE" in capsys.readouterr().err


def test_build_env_refuses_a_non_empty_directory_and_unknown_deps(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("")
    with pytest.raises(EnvError, match="not empty"):
        build_env(tmp_path / "x", tmp_path / "w.whl", deps="inherit")
    with pytest.raises(EnvError, match="deps must be"):
        build_env(tmp_path / "y", tmp_path / "w.whl", deps="conda")
