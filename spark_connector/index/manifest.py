"""The index manifest: the single file whose atomic replacement commits a generation.

Layout of an index directory::

    manifest.json            the current generation (replaced with write-tmp, fsync, os.replace)
    history/gen-000007.json  every committed manifest, for ``upr index info``
    runs/r-000007-<tag>/     Parquet files of one run (rows: value, key, partition, seqno) and,
                             for a local index, its lookup sidecar (``sidecar.py``)
    checkpoint/              the Spark streaming checkpoint of the index's change-feed query

A generation is an ordered list of runs (oldest first): each later run supersedes, key by key,
the rows of the runs before it, and may reset whole partitions (``resets``).  A job killed at
any point leaves ``manifest.json`` naming a complete older generation; files of an uncommitted
run are unreferenced and removed by the next run.  ``batch_id`` is the last Spark micro-batch
applied, which makes replays of that batch (Spark re-runs a batch whose commit it did not log)
no-ops: index and checkpoint advance together.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .errors import IndexError_
from .runs import FORMAT, MANIFEST, Run, read_manifest, runs_from_json

__all__ = ["FORMAT", "MANIFEST", "IndexError_", "Manifest", "Run", "collect_garbage", "commit", "load"]


@dataclass(frozen=True)
class Manifest:
    generation: int
    batch_id: int                              # last Spark batch applied; -1 before the first
    spec: dict[str, str]
    server: str
    runs: tuple[Run, ...] = ()
    offset: dict[str, Any] | None = None       # source end offset of batch_id (per-partition positions)
    rows: int = 0                              # index entries (value IS NOT NULL) at last compaction/estimate
    created: float = field(default_factory=time.time)
    stats: dict[str, Any] = field(default_factory=dict)
    node_id: str = ""                          # the server's data-dir id: the index follows that keyspace

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)          # runs are plain objects: asdict copies them as they are
        out["runs"] = [run.to_json() for run in self.runs]
        out["format"] = FORMAT
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Manifest:
        if raw.get("format") != FORMAT:
            raise IndexError_(f"unsupported index format {raw.get('format')!r}")
        runs = runs_from_json(raw)
        return cls(int(raw["generation"]), int(raw["batch_id"]), dict(raw["spec"]), str(raw["server"]), runs,
                   raw.get("offset"), int(raw.get("rows", 0)), float(raw.get("created", 0)),
                   dict(raw.get("stats", {})), str(raw.get("node_id", "")))

    def next(self, **changes: Any) -> Manifest:
        return replace(self, generation=self.generation + 1, created=time.time(), **changes)


def load(index_dir: str | os.PathLike[str] | Any) -> Manifest | None:
    """The current manifest of ``index_dir`` (a path, a URI or a ``storage.Location``), or None."""
    from .storage import Location, open_location
    where = index_dir if isinstance(index_dir, Location) else open_location(index_dir)
    raw = read_manifest(where)
    return None if raw is None else Manifest.from_json(raw)


def commit(index_dir: str | os.PathLike[str] | Any, manifest: Manifest) -> None:
    """Make ``manifest`` current: readers see either the old or the new generation, never a mix.
    The history copy is written first, the manifest last: the manifest's replacement is the
    commit point (``storage.Location.write_atomic`` says how each filesystem makes it atomic)."""
    from .storage import Location, open_location
    where = index_dir if isinstance(index_dir, Location) else open_location(index_dir)
    text = json.dumps(manifest.to_json(), indent=1, sort_keys=True)
    where.write_atomic(f"history/gen-{manifest.generation:06d}.json", text)
    where.write_atomic(MANIFEST, text)


def collect_garbage(index_dir: str | os.PathLike[str] | Any, manifest: Manifest | None,
                    keep_previous: int = 1) -> list[str]:
    """Remove run directories no recent generation references (uncommitted runs of a killed job,
    runs merged away by compaction).  Runs of the previous ``keep_previous`` generations stay, so
    a reader that loaded the manifest just before a commit can still finish."""
    from .storage import Location, open_location
    where = index_dir if isinstance(index_dir, Location) else open_location(index_dir)
    keep = {r.path for r in manifest.runs} if manifest else set()
    if manifest:
        for gen in range(max(0, manifest.generation - keep_previous), manifest.generation):
            old = where.read_text(f"history/gen-{gen:06d}.json")
            if old is not None:
                keep |= {r["path"] for r in json.loads(old)["runs"]}
    removed = []
    for name in where.list_dir("runs"):
        rel = f"runs/{name}"
        if rel not in keep:
            where.remove_dir(rel)
            removed.append(rel)
    return removed
