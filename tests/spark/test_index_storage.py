"""Index storage through pyarrow filesystems and JVM-free point lookups (no Spark here).

Runs are written as Parquet with pyarrow; the expected answer is ``view.runs_frame``'s rule
applied by brute force in Python (resets kill older rows of a partition; a key's newest live run
wins, markers included; markers are not entries).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from spark_connector.index.lookup import lookup
from spark_connector.index.manifest import Manifest, Run, commit, load
from spark_connector.index.sidecar import SIDECAR, seal_run
from spark_connector.index.storage import Location, StorageError, open_location

ROOT = Path(__file__).resolve().parents[2]

SCHEMA = pa.schema([("value", pa.string()), ("key", pa.string()), ("partition", pa.int32()), ("seqno", pa.int64())])
VALUES = ["oslo", "lima", "rome", None]          # None: a marker row


def _write_index(where: Location, runs: list[tuple[list[tuple], tuple[int, ...]]]) -> Manifest:
    manifest_runs = []
    for i, (rows, resets) in enumerate(runs):
        path = f"runs/r-{i:06d}-t"
        where.fs.create_dir(where.path(path), recursive=True)
        table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], SCHEMA)
        with where.fs.open_output_stream(where.path(f"{path}/part-00000.parquet")) as out:
            pq.write_table(table, out)
        manifest_runs.append(Run(path, resets, len(rows)))
    manifest = Manifest(len(runs), len(runs) - 1, {"kind": "field", "path": "city"}, "http://x",
                        tuple(manifest_runs))
    commit(where, manifest)
    return manifest


def _expected(runs: list[tuple[list[tuple], tuple[int, ...]]], value: str) -> list[dict]:
    last_reset = {p: i for i, (_, resets) in enumerate(runs) for p in resets}
    alive = [(i, r) for i, (rows, _) in enumerate(runs) for r in rows if i >= last_reset.get(r[2], 0)]
    newest: dict[str, int] = {}
    for i, r in alive:
        newest[r[1]] = max(newest.get(r[1], -1), i)
    return sorted(({"key": r[1], "partition": r[2], "seqno": r[3]} for i, r in alive
                   if r[0] == value and newest[r[1]] == i), key=lambda e: e["key"])


def _random_runs(rng: random.Random) -> list[tuple[list[tuple], tuple[int, ...]]]:
    keys = [f"k{i:03d}" for i in range(60)]
    runs, seqno = [], 0
    for _ in range(rng.randint(1, 5)):
        rows = []
        for key in rng.sample(keys, rng.randint(0, 30)):
            seqno += 1
            values = rng.sample(VALUES[:3], rng.randint(1, 2)) if rng.random() < 0.8 else [None]
            rows += [(v, key, int(key[1:]) % 4, seqno) for v in values]
        resets = tuple(sorted(rng.sample(range(4), rng.randint(0, 1)))) if runs else ()
        runs.append((rows, resets))
    return runs


@pytest.mark.parametrize("seed", range(25))
def test_lookup_equals_the_views_rule_on_random_generations(tmp_path, seed):
    rng = random.Random(seed)
    runs = _random_runs(rng)
    where = open_location(tmp_path / "idx")
    _write_index(where, runs)
    for value in VALUES[:3] + ["absent"]:
        assert lookup(tmp_path / "idx", value) == _expected(runs, value)
    # the same generation with a lookup sidecar per run: the stdlib path gives the same answers
    sealed = _seal(where, load(where))
    assert all(run.sidecar == SIDECAR for run in sealed.runs)
    assert [run.rows for run in sealed.runs] == [len(rows) for rows, _ in runs]
    for value in VALUES[:3] + ["absent"]:
        assert lookup(tmp_path / "idx", value) == _expected(runs, value)
        assert lookup(tmp_path / "idx", value, sidecars=False) == _expected(runs, value)


def _seal(where: Location, manifest: Manifest) -> Manifest:
    sealed = manifest.next(runs=tuple(seal_run(where, run.path, run.resets, first=i == 0)
                                      for i, run in enumerate(manifest.runs)))
    commit(where, sealed)
    return sealed


def test_a_local_query_with_sidecars_imports_neither_pyarrow_nor_the_index_model(tmp_path):
    """A new ``upr index query`` process imports what the lookup needs: not pyarrow, nor the
    manifest model (``dataclasses``), nor ``typing`` (docs/benchmarks.md, Spark)."""
    runs = _random_runs(random.Random(7))
    where = open_location(tmp_path / "idx")
    _seal(where, _write_index(where, runs))
    script = ("import sys; from app.cli import main; code = main(['index', 'query', '--index', sys.argv[1], "
              "'--value', 'oslo', '--json']); "
              "print([m for m in ('pyarrow', 'dataclasses', 'typing') if m in sys.modules], file=sys.stderr); "
              "sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "idx")], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "[]"
    assert [json.loads(line) for line in out.stdout.splitlines()] == _expected(runs, "oslo")


@pytest.mark.parametrize("block", [1, 2, 3, 256])
def test_sidecar_blocks_and_escapes_agree_with_the_rule(tmp_path, monkeypatch, block):
    """Values and keys with TAB, newline, backslash and non-ASCII text, over blocks of a few lines
    (a value's rows span several blocks; candidates sit at block edges)."""
    import spark_connector.index.sidecar as sidecar
    monkeypatch.setattr(sidecar, "BLOCK", block)
    rng = random.Random(block)
    values = ["oslo", "a\tb", "a\tb\\", "tab\there", "new\nline", "ünï", "a", "b", "", "x\\ty", "x\\y", "\\"]
    keys = [f"k{i:02d}" for i in range(30)] + ["k\t1", "k\n2", "k\\3", "kö4", "k 5"]
    runs, seqno = [], 0
    for i in range(4):
        rows = []
        for key in rng.sample(keys, rng.randint(1, len(keys))):
            seqno += 1
            rows += [(v, key, len(key) % 3, seqno) for v in rng.sample(values, rng.randint(0, 3)) or [None]]
        runs.append((rows, (1,) if i == 2 else ()))
    where = open_location(tmp_path / "idx")
    _seal(where, _write_index(where, runs))
    for value in values + ["absent", "zzz", "\x00"]:
        assert lookup(tmp_path / "idx", value) == _expected(runs, value), value
        assert lookup(tmp_path / "idx", value, sidecars=False) == _expected(runs, value), value


def test_a_sidecar_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    runs = _random_runs(random.Random(3))
    where = open_location(tmp_path / "idx")
    manifest = _write_index(where, runs)
    run = manifest.runs[0]

    def broken(*args, **kwargs):
        raise OSError("disk full")
    import spark_connector.index.sidecar as sidecar
    monkeypatch.setattr(sidecar, "_section", broken)
    with pytest.raises(OSError, match="disk full"):
        seal_run(where, run.path)
    assert where.list_dir(run.path) == ["part-00000.parquet"]       # no sidecar, no temporary file
    assert load(where) == manifest and lookup(tmp_path / "idx", "oslo") == _expected(runs, "oslo")


def test_the_same_index_through_a_non_local_filesystem_and_a_file_uri(tmp_path):
    runs = _random_runs(random.Random(99))
    mock = pafs._MockFileSystem()           # pyarrow's in-memory filesystem ("mock://" in Arrow)
    where = open_location("bucket/indexes/city", filesystem=mock)
    written = _write_index(where, runs)
    assert load(where) == written
    assert mock.get_file_info("bucket/indexes/city/history/gen-%06d.json" % written.generation).size > 0
    for value in VALUES[:3]:
        assert lookup(where, value) == _expected(runs, value)
    _write_index(open_location(tmp_path / "local"), runs)
    uri = (tmp_path / "local").as_uri()
    assert uri.startswith("file://") and lookup(uri, "oslo") == _expected(runs, "oslo")


def test_the_manifest_switch_is_a_move_and_leaves_no_temporary_files(tmp_path):
    mock = pafs._MockFileSystem()
    where = open_location("idx", filesystem=mock)
    base = Manifest(1, 0, {"kind": "field", "path": "c"}, "http://x")
    commit(where, base)
    commit(where, base.next(batch_id=1))
    names = where.list_dir("") + where.list_dir("history")
    assert [n for n in names if ".tmp" in n] == []
    assert load(where).generation == 2 and where.list_dir("history") == ["gen-000001.json", "gen-000002.json"]


def test_unusable_schemes_are_refused_in_one_line():
    with pytest.raises(StorageError) as hdfs:
        open_location("hdfs://namenode.invalid:8020/idx")
    assert "\n" not in str(hdfs.value) and "libhdfs" in str(hdfs.value)
    try:
        import fsspec  # noqa: F401
    except ImportError:
        with pytest.raises(StorageError, match="fsspec is not installed") as mem:
            open_location("memory://idx")
        assert "\n" not in str(mem.value)
    else:                                   # fsspec present: its in-memory scheme works for real
        where = open_location("memory://idx")
        commit(where, Manifest(1, 0, {"kind": "field", "path": "c"}, "http://x"))
        assert load("memory://idx").generation == 1


def test_lookup_of_a_missing_index_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no index here"):
        lookup(tmp_path / "nothing", "oslo")


def test_a_build_takes_file_uris_as_paths_and_refuses_unknown_schemes_in_one_line(tmp_path):
    from spark_connector.index.functions import FieldIndex
    from spark_connector.index.job import IndexJob
    assert IndexJob(None, (tmp_path / "i").as_uri(), "http://x", FieldIndex("city")).root == tmp_path / "i"
    with pytest.raises(StorageError) as refused:
        IndexJob(None, "nosuchscheme://bucket/idx", "http://x", FieldIndex("city"))
    assert "\n" not in str(refused.value) and "nosuchscheme://" in str(refused.value)
