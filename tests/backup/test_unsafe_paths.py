"""A crafted archive cannot make ``verify`` or ``restore`` open files outside its run directories.

Archives are input: copied from object stores, handed over for a restore.  A manifest's segment
name, its run id and a segment that is a symlink are all refused with ``UnsafeArchivePath``,
which names the archive, the run and the segment; the CLI says so in one line and exits 1.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from clients.backup.archive import MANIFEST, Archive, run_id_problem, segment_name_problem
from clients.backup.errors import CorruptArchive, UnsafeArchivePath
from clients.backup.fsutil import atomic_write
from clients.backup.manifest import read_sealed, seal
from clients.backup.plan import summarize
from clients.backup.verify import verify

from .offline import History, write_run

P = 2


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("p0000.seg", None),
        ("p0063.seg", None),
        ("segment with spaces.seg", None),
        ("..seg", None),
        ("", "is empty"),
        (".", "names a directory"),
        ("..", "names a directory"),
        ("../p0000.seg", "contains a path separator"),
        ("../../../../etc/passwd", "contains a path separator"),
        ("parts/p0000.json", "contains a path separator"),
        ("sub\\p0000.seg", "contains a path separator"),
        ("/etc/passwd", "is an absolute path"),
        ("\\\\server\\share\\x.seg", "is an absolute path"),
        ("p0000.seg\0.txt", "contains a NUL byte"),
        (7, "is a int, not a file name"),
        (["p0000.seg"], "is a list, not a file name"),
    ],
)
def test_segment_name_rule(name: object, problem: str | None) -> None:
    found = segment_name_problem(name)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


@pytest.mark.parametrize(
    ("run_id", "ok"),
    [
        ("20260101T120000123456Z", True),
        ("20260101T120000123456Z-m3", True),
        ("20260101T120000123456Z/..", False),
        ("../20260101T120000123456Z", False),
        ("..", False),
        ("", False),
        ("/tmp", False),
        (None, False),
    ],
)
def test_run_id_rule(run_id: object, ok: bool) -> None:
    assert (run_id_problem(run_id) is None) is ok


# ------------------------------------------------------------------ crafted archives
def _archive_with_one_run(tmp_path: Path) -> tuple[Archive, str]:
    archive = Archive.open_or_create(tmp_path / "arch", "node-a", P)
    h = History(P)
    h.random_writes(random.Random(3), 40)
    write_run(archive, h)
    return archive, archive.runs()[-1].run_id


def _outside_copy(archive: Archive, run_id: str, tmp_path: Path) -> Path:
    """A valid segment outside the archive: on an unguarded reader it would verify and restore fine."""
    outside = tmp_path / "outside.seg"
    outside.write_bytes(archive.segment_path(run_id, "p0000.seg").read_bytes())
    return outside


def _rename_segment_in_manifest(archive: Archive, run_id: str, name: str) -> None:
    path = archive.run_dir(run_id) / MANIFEST
    doc = read_sealed(path)
    doc["partitions"]["0"]["segment"] = name
    atomic_write(path, seal(doc))


def test_traversing_segment_name_is_refused_by_verify_and_restore_plan(tmp_path: Path) -> None:
    archive, run_id = _archive_with_one_run(tmp_path)
    _outside_copy(archive, run_id, tmp_path)
    _rename_segment_in_manifest(archive, run_id, "../../../outside.seg")
    report = verify(archive)
    unsafe = [p for p in report.problems if isinstance(p, UnsafeArchivePath)]
    assert len(unsafe) == 1, [str(p) for p in report.problems]
    err = unsafe[0]
    assert (err.archive, err.run_id, err.segment, err.partition) == (
        str(archive.root), run_id, "../../../outside.seg", 0)
    assert err.to_dict()["code"] == "unsafe_archive_path"
    with pytest.raises(UnsafeArchivePath, match="contains a path separator"):
        summarize(archive, None, [0], None)


def test_segment_symlink_out_of_the_run_is_refused(tmp_path: Path) -> None:
    archive, run_id = _archive_with_one_run(tmp_path)
    outside = _outside_copy(archive, run_id, tmp_path)
    seg = archive.run_dir(run_id) / "p0000.seg"
    seg.unlink()
    seg.symlink_to(outside)
    report = verify(archive)
    assert any(isinstance(p, UnsafeArchivePath) and "symlink" in str(p) for p in report.problems), report.problems
    with pytest.raises(UnsafeArchivePath, match="outside the run directory"):
        summarize(archive, None, [0], None)


def test_run_directory_symlinked_out_of_the_archive_is_refused(tmp_path: Path) -> None:
    archive, run_id = _archive_with_one_run(tmp_path)
    rdir = archive.run_dir(run_id)
    elsewhere = tmp_path / "elsewhere"
    os.replace(rdir, elsewhere)
    rdir.symlink_to(elsewhere, target_is_directory=True)
    report = verify(archive)
    unsafe = [p for p in report.problems if isinstance(p, UnsafeArchivePath)]
    assert unsafe and all("outside the run directory" in str(p) for p in unsafe), report.problems


def test_segment_symlink_inside_the_run_is_followed(tmp_path: Path) -> None:
    archive, run_id = _archive_with_one_run(tmp_path)
    rdir = archive.run_dir(run_id)
    os.replace(rdir / "p0000.seg", rdir / "p0000.real")
    (rdir / "p0000.seg").symlink_to("p0000.real")
    assert verify(archive).ok


def test_manifest_claiming_another_run_id_is_refused(tmp_path: Path) -> None:
    archive, run_id = _archive_with_one_run(tmp_path)
    path = archive.run_dir(run_id) / MANIFEST
    doc = read_sealed(path)
    doc["run_id"] = "../../elsewhere"
    atomic_write(path, seal(doc))
    with pytest.raises(UnsafeArchivePath, match="claims to be run"):
        archive.runs()


def test_merged_from_cannot_point_cleanup_outside_the_archive(tmp_path: Path) -> None:
    archive, run_id = _archive_with_one_run(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    path = archive.run_dir(run_id) / MANIFEST
    doc = read_sealed(path)
    doc["merged_from"] = ["../../victim"]
    atomic_write(path, seal(doc))
    with pytest.raises(UnsafeArchivePath, match="is not a run id"):
        archive.cleanup()
    assert victim.is_dir()
    assert issubclass(UnsafeArchivePath, CorruptArchive)


def _upr(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", *argv],
        capture_output=True, text=True, timeout=120,
    )


def test_cli_refuses_a_crafted_archive_in_one_line(tmp_path: Path) -> None:
    archive, run_id = _archive_with_one_run(tmp_path)
    _outside_copy(archive, run_id, tmp_path)
    _rename_segment_in_manifest(archive, run_id, "../../../outside.seg")

    out = _upr("backup", "verify", "--archive", str(archive.root), "--quiet")
    assert out.returncode == 1, out.stdout + out.stderr
    refused = [line for line in out.stdout.splitlines() if "refused" in line]
    assert len(refused) == 1, out.stdout
    assert str(archive.root) in refused[0] and run_id in refused[0] and "../../../outside.seg" in refused[0]

    out = _upr("backup", "restore", "--archive", str(archive.root), "--dry-run", "--quiet")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("upr backup restore: error:")
    assert run_id in lines[0] and "../../../outside.seg" in lines[0] and "refused" in lines[0]
