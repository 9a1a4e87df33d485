"""Point lookups on an index with pyarrow alone: no SparkSession, no JVM.

A lookup reads the ``value`` column of each run with a pushed-down filter and then resolves the
candidates with ``view.runs_frame``'s rules, restricted to the candidate keys: a row of run i is
dead if a later run resets its partition or holds any row (entry or marker) of its key.  So the
cost is one filtered column scan per run plus a ``key IN (candidates)`` scan of the later runs,
whatever the index size, where a SparkSession costs seconds to start (docs/benchmarks.md,
Spark: index point lookups).

A local index whose runs all carry a lookup sidecar (``sidecar.py``) is answered from those with
the stdlib alone, by the same rule: two B-tree lookups per run instead of column scans, and no
pyarrow import, which is most of a new process's CPU.  Other indexes (remote ones, or runs
written before sidecars) take the Parquet path.
"""
from __future__ import annotations

import os
from collections.abc import Callable

from .runs import Run, read_manifest, runs_from_json
from .storage import Location, open_location

TYPE_CHECKING = False   # typing only for the checkers: `upr index query` imports this module (docs/benchmarks.md)
if TYPE_CHECKING:
    from typing import Any

    from .manifest import Manifest

__all__ = ["lookup"]


def strings(values: list[str]) -> Any:
    """A pyarrow string array of ``values``, built from its buffers.

    ``pa.array(list)`` and a Python scalar handed to a compute function go through pyarrow's
    Python-object conversion, which imports pandas to recognise its NA values: more CPU than
    the whole lookup of a command-line query (docs/benchmarks.md, index point lookups)."""
    import pyarrow as pa
    from array import array

    data = [v.encode() for v in values]
    offsets = array("i", [0])
    end = 0
    for d in data:
        end += len(d)
        offsets.append(end)
    if offsets.itemsize != 4 or end >= 2**31:
        raise ValueError("index lookup: too many candidate keys for one string array")
    return pa.Array.from_buffers(pa.string(), len(data),
                                 [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(data))])


def _compute() -> tuple[Callable[..., Any], Any]:
    """pyarrow's ``call_function`` and ``SetLookupOptions`` from its compute core: the public
    ``pyarrow.compute`` module generates a wrapper and a docstring per kernel when imported,
    about as much CPU as a whole lookup; the kernels are the same."""
    try:
        from pyarrow._compute import SetLookupOptions, call_function
    except ImportError:                 # the core moved: the public module has both too
        from pyarrow.compute import SetLookupOptions, call_function
    return call_function, SetLookupOptions


def _read(where: Location, run_path: str, columns: list[str], keep: Callable[[Any], Any] | None = None) -> Any:
    """The run's ``columns`` (rows where ``keep(table)`` is true), or None for an empty run.
    ``ParquetFile`` and compute kernels only: ``pyarrow.dataset`` (and so ``pq.read_table``)
    imports pandas, which costs a command-line lookup more CPU than the lookup itself."""
    import pyarrow as pa

    call, _ = _compute()
    tables = []
    for path in where.parquet_files(run_path):
        pf = where.open_parquet(path)
        with pf:
            if keep is None:
                tables.append(pf.read(columns=columns))
                continue
            probe = pf.read(columns=[c for c in ("value", "key") if c in columns][:1])
            mask = keep(probe)
            if call("any", [mask]).as_py():             # only then read the other columns
                tables.append(call("filter", [pf.read(columns=columns), mask]))
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else None


def lookup(index: str | os.PathLike[str] | Location, value: str, manifest: Manifest | None = None,
           sidecars: bool = True) -> list[dict[str, Any]]:
    """Entries ``{"key", "partition", "seqno"}`` whose indexed value equals ``value``, by key.
    ``sidecars=False`` reads the Parquet runs even where sidecars exist (they must agree)."""
    where = index if isinstance(index, Location) else open_location(index)
    if manifest is not None:
        runs = manifest.runs
    else:           # the runs alone: the manifest model costs a one-shot lookup (runs.py)
        raw = read_manifest(where)
        if raw is None:
            raise FileNotFoundError(f"{where.display()}: no index here (manifest.json missing)")
        runs = runs_from_json(raw)
    if sidecars and where.is_local and all(run.sidecar for run in runs):
        return _lookup_sidecars(where, runs, value)
    return _lookup_parquet(where, runs, value)


def _last_resets(runs: tuple[Run, ...]) -> dict[int, int]:
    """Partition -> index of the newest run that resets it: older runs' rows of it are dead."""
    return {p: i for i, run in enumerate(runs) for p in run.resets}


def _lookup_sidecars(where: Location, runs: tuple[Run, ...], value: str) -> list[dict[str, Any]]:
    from itertools import compress, repeat

    from .sidecar import CandidateKeys, Sidecar

    last_reset = _last_resets(runs)
    candidates: dict[str, tuple[int, int, int]] = {}       # key -> (run, partition, seqno)
    first = len(runs)
    for i, run in enumerate(runs):
        with Sidecar(where.path(f"{run.path}/{run.sidecar}")) as side:
            keys, parts, seqnos = side.entries(value)
        dead = {p for p, j in last_reset.items() if j > i}  # a later run resets them
        if dead and not dead.isdisjoint(parts):
            alive = [p not in dead for p in parts]
            keys = list(compress(keys, alive))
            parts = list(compress(parts, alive))
            seqnos = list(compress(seqnos, alive))
        if keys:
            first = min(first, i)
            candidates.update(zip(keys, zip(repeat(i), parts, seqnos)))    # a later run's row of a key wins
    if not candidates:
        return []
    asked = CandidateKeys(candidates)
    superseded: set[str] = set()
    for j in range(first + 1, len(runs)):
        dead = {p for p, r in last_reset.items() if r > j}
        with Sidecar(where.path(f"{runs[j].path}/{runs[j].sidecar}")) as side:
            for key, p in side.holders(asked):
                if p not in dead and candidates[key][0] < j:
                    superseded.add(key)
    return [{"key": key, "partition": p, "seqno": s} for key, (_, p, s) in sorted(candidates.items())
            if key not in superseded]


def _lookup_parquet(where: Location, runs: tuple[Run, ...], value: str) -> list[dict[str, Any]]:
    call, set_lookup = _compute()
    wanted = strings([value])[0]
    last_reset = _last_resets(runs)
    candidates: dict[str, tuple[int, int, int]] = {}       # key -> (run, partition, seqno)
    for i, run in enumerate(runs):
        t = _read(where, run.path, ["value", "key", "partition", "seqno"], lambda t: call("equal", [t["value"], wanted]))
        if t is None:
            continue
        for key, p, s in zip(t["key"].to_pylist(), t["partition"].to_pylist(), t["seqno"].to_pylist()):
            if i >= last_reset.get(p, 0):
                candidates[key] = (i, p, s)                 # a later run's row of the key wins
    if not candidates:
        return []
    newest = {key: run for key, (run, _, _) in candidates.items()}
    first = min(newest.values())
    in_keys = set_lookup(strings(list(candidates)))
    for j in range(first + 1, len(runs)):
        t = _read(where, runs[j].path, ["key", "partition"], lambda t: call("is_in", [t["key"]], in_keys))
        if t is None:
            continue
        for key, p in zip(t["key"].to_pylist(), t["partition"].to_pylist()):
            if j >= last_reset.get(p, 0) and j > newest[key]:
                newest[key] = j
    return [{"key": key, "partition": p, "seqno": s} for key, (run, p, s) in sorted(candidates.items())
            if newest[key] == run]
