"""Pure parts of the index jobs: the field index function and the manifest commit/GC rules."""
from __future__ import annotations

import json

import pytest

from spark_connector.index.functions import FieldIndex, spec_of
from spark_connector.index.manifest import IndexError_, Manifest, Run, collect_garbage, commit, load


@pytest.mark.parametrize("path, doc, expect", [
    ("city", {"city": "oslo"}, ["oslo"]),
    ("city", {"city": 12}, ["12"]),
    ("city", {"city": 1.5}, ["1.5"]),
    ("city", {"city": True}, ["true"]),
    ("city", {"city": None}, []),
    ("city", {"town": "x"}, []),
    ("city", ["not", "an", "object"], []),
    ("city", {"city": ["a", "b", "a"]}, ["a", "b"]),             # multi-entry, no duplicates
    ("city", {"city": {"b": 1, "a": 2}}, ['{"a":2,"b":1}']),
    ("a.b", {"a": {"b": "deep"}}, ["deep"]),
    ("a.b", {"a": "flat"}, []),
])
def test_field_index(path, doc, expect):
    assert FieldIndex(path)("k", json.dumps(doc).encode()) == expect


def test_field_index_tolerates_non_json_and_rejects_bad_paths():
    assert FieldIndex("city")("k", b"\xff not json") == []
    for bad in ("", "a..b", ".a"):
        with pytest.raises(ValueError):
            FieldIndex(bad)
    assert spec_of(FieldIndex("a.b")) == {"kind": "field", "path": "a.b"}
    assert spec_of(lambda k, v: [], name="tags") == {"kind": "custom", "name": "tags"}


def test_commit_replaces_atomically_and_gc_keeps_current_and_previous(tmp_path):
    for name in ("r1", "r2", "r3", "orphan"):
        (tmp_path / "runs" / name).mkdir(parents=True)
    m1 = Manifest(1, 0, {"kind": "field", "path": "c"}, "http://x", (Run("runs/r1"),))
    commit(tmp_path, m1)
    m2 = m1.next(batch_id=1, runs=(Run("runs/r2", (3,), 10),))
    commit(tmp_path, m2)
    assert load(tmp_path) == m2
    assert not list(tmp_path.glob("*.tmp-*"))
    removed = collect_garbage(tmp_path, m2)
    assert sorted(removed) == ["runs/orphan", "runs/r3"]              # r1: previous generation, kept
    m3 = m2.next(batch_id=2, runs=(Run("runs/r2", (3,), 10),))
    commit(tmp_path, m3)
    assert collect_garbage(tmp_path, m3) == ["runs/r1"]


def test_corrupt_manifest_is_a_clear_error(tmp_path):
    (tmp_path / "manifest.json").write_text("{half")
    with pytest.raises(IndexError_, match="corrupt manifest"):
        load(tmp_path)
    assert load(tmp_path / "nowhere") is None


def test_public_api_is_pinned_and_lazy():
    import spark_connector
    assert spark_connector.__all__ == ["FieldIndex", "IndexJob", "UprDataSource", "load_index", "local_session"]
    for name in spark_connector.__all__:
        assert getattr(spark_connector, name).__name__ == name
