"""The Python environment Spark's executors run: this project's wheel in a venv of its own.

Executors import the connector (``read()`` of the ``upr`` source, index functions in
``mapInArrow``) in Python processes that Spark starts with ``PYSPARK_PYTHON``.  On one machine
that is this interpreter; on a cluster it must be an interpreter whose environment holds the
project, which the driver's venv on the driver's host is not.  Spark documents two ways to get
there (Python package management in its docs): an environment installed at the same path on
every host, or a packed environment shipped with ``spark.archives`` and unpacked by Spark next
to each executor.  Both start from the same venv, built here from a wheel of this project:

* ``build_wheel``: the project's wheel, built by pip with the project's own build backend;
* ``build_env``: a new venv with that wheel installed; its third-party dependencies come from
  the package index (``deps="install"``), or, for hosts that share this machine's image and
  cannot reach an index, from this interpreter's site-packages (``deps="inherit"``: a path in a
  ``.pth`` file, so the driver's own project install, an editable hook, stays invisible);
* ``pack``: the venv as a ``.tar.gz`` for ``spark.archives``.

``python_for`` decides what ``PYSPARK_PYTHON`` and which confs a master needs (pure, tested
without Spark).
"""
from __future__ import annotations

import os
import subprocess
import sys
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ARCHIVE_ALIAS", "EnvError", "PythonChoice", "build_env", "build_wheel", "is_local_master",
           "pack", "python_for", "project_root"]

#: The directory name Spark unpacks a shipped archive to, in each executor's working directory.
ARCHIVE_ALIAS = "upr_env"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
#: What executors need beyond the wheel's own dependencies: the source yields Arrow batches.
EXECUTOR_EXTRAS = ("pyarrow>=15",)
#: What a wheel is built from (pyproject.toml's packages, its readme, the build configuration).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "app", "engine", "clients", "spark_connector")


class EnvError(Exception):
    """The executor environment cannot be built or used (the message says which step and why)."""


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


@dataclass(frozen=True)
class PythonChoice:
    """``pyspark_python``: the value for ``PYSPARK_PYTHON``; ``conf``: Spark confs to add;
    ``wrapped``: whether it is the local launcher that needs ``UPR_SPARK_PYTHON``."""

    pyspark_python: str
    conf: Mapping[str, str] = field(default_factory=dict)
    wrapped: bool = False


def python_for(master: str, executor_env: str | None, *, this_python: str, wrapper: str | None) -> PythonChoice:
    """What Python Spark's workers run for ``master``.

    * a local master: this interpreter (through ``wrapper`` when there is one: it drops the
      zipped pyspark copy, see ``spark_python.sh``); the wrapper reads ``UPR_SPARK_PYTHON``,
      which only processes started by this driver have, so it is never used for other masters;
    * ``executor_env`` a directory: its ``bin/python``, which must exist at that path on every
      host (a shared mount, or the same image);
    * ``executor_env`` an archive: shipped with ``spark.archives`` and run from the directory
      Spark unpacks it to in each executor's working directory;
    * otherwise: this interpreter by absolute path, right when every host has this venv at the
      same path (one machine, or identical images).
    """
    if executor_env is None:
        if is_local_master(master) and wrapper:
            return PythonChoice(wrapper, wrapped=True)
        return PythonChoice(this_python)
    if executor_env.endswith(ARCHIVE_SUFFIXES):
        archive = executor_env if "://" in executor_env else os.path.abspath(executor_env)
        return PythonChoice(f"./{ARCHIVE_ALIAS}/bin/python", {"spark.archives": f"{archive}#{ARCHIVE_ALIAS}"})
    return PythonChoice(str(Path(executor_env).absolute() / "bin" / "python"))


def project_root() -> Path:
    """The source checkout this package runs from (the wheel is built from it)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        raise EnvError(f"{root} is not a source checkout (no pyproject.toml): build the executor "
                       "environment from a checkout, or install the published wheel into it with pip")
    return root


def _run(step: str, cmd: list[str], **kw: object) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise EnvError(f"{step} failed (exit {done.returncode}): " + " | ".join(tail))


def build_wheel(out_dir: Path, *, source: Path | None = None, python: str = sys.executable) -> Path:
    """Build this project's wheel into ``out_dir`` and return its path."""
    source = source or project_root()
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("upr-*.whl"))
    with tempfile.TemporaryDirectory(prefix="upr-wheel-") as tmp:
        # pip builds in the source tree (build/, *.egg-info): give it a copy of what the wheel
        # holds, so a checkout (and the venv a checkout may hold) is never written or walked.
        staged = Path(tmp) / "src"
        staged.mkdir()
        for name in WHEEL_SOURCES:
            src = source / name
            if src.is_dir():
                shutil.copytree(src, staged / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif src.is_file():
                shutil.copy2(src, staged / name)
        _run("building the upr wheel",
             [python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out_dir.absolute()), str(staged)])
    wheels = sorted(set(out_dir.glob("upr-*.whl")) - before) or sorted(out_dir.glob("upr-*.whl"))
    if not wheels:
        raise EnvError(f"pip built no upr wheel in {out_dir}")
    return wheels[-1]


def site_packages(python: str = sys.executable) -> list[str]:
    """The site-packages directories of ``python`` (its purelib and platlib)."""
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'));"
                          "print(sysconfig.get_path('platlib'))"], capture_output=True, text=True, check=True)
    return list(dict.fromkeys(out.stdout.split()))


def build_env(dest: Path, wheel: Path, *, deps: str = "install", base_python: str = sys.executable) -> Path:
    """A new venv at ``dest`` with ``wheel`` installed; returns its ``bin/python``.

    ``deps="install"`` installs the wheel's dependencies and pyarrow from the package index;
    ``deps="inherit"`` installs the wheel alone and reaches the third-party packages of
    ``base_python`` through a ``.pth`` path (hosts sharing this image, no index needed).
    """
    if deps not in ("install", "inherit"):
        raise EnvError(f"deps must be 'install' or 'inherit', not {deps!r}")
    if dest.exists() and any(dest.iterdir()):
        raise EnvError(f"{dest} exists and is not empty; choose a new directory")
    _run("creating the venv", [base_python, "-m", "venv", "--without-pip", str(dest)])
    python = dest / "bin" / "python"
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    # --ignore-installed: pip run by the base interpreter otherwise treats a `upr` installed there
    # (an editable checkout) as the one to replace, and uninstalls it from the base environment
    # before installing into the prefix; it also makes the new venv hold its own dependencies.
    pip = [base_python, "-m", "pip", "install", "-q", "--no-warn-script-location", "--ignore-installed",
           "--prefix", str(dest)]
    if deps == "inherit":
        _run("installing the upr wheel", [*pip, "--no-deps", str(wheel)])
        inherited = site_packages(base_python)
        (target / "_upr_inherited.pth").write_text("\n".join(inherited) + "\n" + _drop_zips_line(inherited) + "\n")
    else:
        _run("installing the upr wheel and its dependencies", [*pip, str(wheel), *EXECUTOR_EXTRAS])
    _run("checking the environment", [str(python), "-c", "import pyarrow, spark_connector.task"],
         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd="/")
    return python


def _drop_zips_line(inherited: list[str]) -> str:
    """A ``.pth`` import line doing what ``spark_python.sh`` does for local sessions: Spark puts the
    zipped pyspark and py4j of its SPARK_HOME first on every worker's PYTHONPATH, and zipimport
    compiles every module from source in each new process (~0.5 s of CPU; under load that alone
    can outlast Spark's wait for a worker to connect back).  When that SPARK_HOME is the pyspark
    installed in the inherited site-packages, the same modules are importable byte-compiled from
    there, so the zips are dropped; any other SPARK_HOME keeps them."""
    homes = [os.path.join(p, "pyspark") for p in inherited]
    return ("import sys; sys.path[:] = [p for p in sys.path if not (p.endswith('.zip') and "
            f"p.rsplit('/python/lib/', 1)[0] in {homes!r})]")


def pack(env_dir: Path, archive: Path) -> Path:
    """``env_dir`` as a ``.tar.gz`` for ``spark.archives`` (symlinks kept as links: a venv's
    ``bin/python`` points at the base interpreter, which must exist on the executors' hosts at
    the same path, as with any packed venv)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
        for child in sorted(env_dir.iterdir()):
            tar.add(child, arcname=child.name)
    os.replace(tmp, archive)
    return archive
