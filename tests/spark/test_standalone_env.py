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


def _dummy_wheel(out, version: str):  # type: ignore[no-untyped-def]
    """A minimal ``upr`` wheel (just metadata): enough for pip's install/uninstall decisions."""
    import zipfile
    path = out / f"upr-{version}-py3-none-any.whl"
    info = f"upr-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: upr\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def test_building_an_env_leaves_the_base_environments_upr_installed(tmp_path):
    """pip run by the base interpreter with --prefix would uninstall the base's own ``upr`` (the
    shared venv's editable checkout) before installing into the new venv."""
    import subprocess
    import sys
    base = tmp_path / "base"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages",
                    str(base)], check=True)
    python = str(base / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(_dummy_wheel(tmp_path, "0.0.1"))],
                   check=True, capture_output=True)
    newer = tmp_path / "newer"
    newer.mkdir()
    with pytest.raises(EnvError, match="checking the environment"):       # a metadata-only wheel
        build_env(tmp_path / "env", _dummy_wheel(newer, "0.0.2"), deps="inherit", base_python=python)
    version = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('upr'))"],
                             capture_output=True, text=True, check=True, cwd="/").stdout.strip()
    assert version == "0.0.1"
    installed = list((tmp_path / "env").glob("lib/python*/site-packages/upr-0.0.2.dist-info"))
    assert installed, "the wheel went into the new venv"
