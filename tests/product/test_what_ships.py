"""What the wheel holds and what a server or client install needs: no JVM stack, no bench.

The Spark stack (PySpark, pandas, pyarrow) is the ``spark`` extra; the server, the client
library and every CLI group's argument parsing work without it, and ``upr index`` says in one
line which extra to install."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPARK_STACK = ("pyspark", "pandas", "pyarrow", "py4j")

#: Runs with the Spark stack made unimportable, as on a server-only install.
_WITHOUT_SPARK = "import sys\nfor m in {mods!r}: sys.modules[m] = None\n".format(mods=SPARK_STACK)


def _python(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dep_names(deps: list[str]) -> set[str]:
    import re

    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}


def test_the_spark_stack_is_an_extra_not_a_dependency() -> None:
    project = _pyproject()["project"]
    core = _dep_names(project["dependencies"])
    assert core.isdisjoint({"pyspark", "pandas", "pyarrow"}), core
    assert {"pyspark", "pandas", "pyarrow"} <= _dep_names(project["optional-dependencies"]["spark"])
    # `make test` installs the Spark tests' needs too
    assert "upr[spark]" in project["optional-dependencies"]["dev"]
    assert ".[dev,spark]" in (ROOT / "Makefile").read_text()


def test_the_wheel_holds_the_product_packages_only() -> None:
    from setuptools import find_packages

    include = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = find_packages(where=str(ROOT), include=include)
    tops = {name.partition(".")[0] for name in shipped}
    assert tops == {"app", "engine", "clients", "spark_connector"}, tops


@pytest.mark.parametrize(
    "code",
    [
        "from app.cli import build_parser\ntry:\n    build_parser().parse_args(['server', '--help'])\nexcept SystemExit:\n    pass",
        "import clients\nfrom clients import Consumer, FileStateStore",
        "import clients.backup, clients.backup.cli\nimport spark_connector, spark_connector.cli",
        "from app.main import create_app",
    ],
    ids=["server-help", "clients", "backup-and-index-parsers", "server-app"],
)
def test_server_and_clients_never_import_the_spark_stack(code: str) -> None:
    probe = code + "\nimport sys\nprint(sorted(m for m in sys.modules if m.partition('.')[0] in {mods!r}))".format(
        mods=SPARK_STACK)
    out = _python(probe)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_index_without_the_spark_extra_is_one_clear_line(tmp_path: Path) -> None:
    out = _python(_WITHOUT_SPARK + "from app.cli import main\nsys.exit(main())",
                  "index", "run", "--index", str(tmp_path / "idx"), "--field", "city",
                  "--server", "http://127.0.0.1:9")
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "upr index:" in lines[0] and "'spark' extra" in lines[0] and "pip install 'upr[spark]'" in lines[0]
    assert not (tmp_path / "idx").exists()


def test_other_missing_modules_are_not_blamed_on_an_extra() -> None:
    from app.cli import missing_extra

    assert missing_extra(ModuleNotFoundError("x", name="pyspark.sql")) == "spark"
    assert missing_extra(ModuleNotFoundError("x", name="pandas")) == "spark"
    assert missing_extra(ModuleNotFoundError("x", name="lmdb")) is None
    assert missing_extra(ModuleNotFoundError("x")) is None
