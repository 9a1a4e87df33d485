"""A run's lookup sidecar: its rows in an SQLite file, read by point lookups with the stdlib.

A ``upr index query`` in a new process spends most of its CPU importing pyarrow and scanning
whole Parquet columns (docs/benchmarks.md, Spark: index point lookups).  Next to the Parquet files
of a local run, the job writes ``lookup.sqlite``: the same rows, in two tables clustered on the
two questions a lookup asks, so the ``sqlite3`` module answers both from B-trees without reading
the rest of the run:

* ``entries(value, key, partition, seqno)``, by value: the rows whose value equals the one asked;
* ``keys(key, partition)``, every key of the run (entries and markers), by key: does a later run
  hold this candidate (and so supersede its row)?

The sidecar is derived from the run's Parquet files after they are complete and before the
manifest names the run (``seal_run``), like the run itself: a sidecar is either complete and
referenced by a committed manifest (``Run.sidecar``) or ignored.  A run is never rewritten, so
readers open it ``immutable`` (no locks, no journal).  Remote indexes have none: the stdlib cannot
read ``s3://``; their lookups go through pyarrow.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from typing import Any

from .manifest import Run
from .storage import Location

__all__ = ["SIDECAR", "seal_run", "write_sidecar", "Sidecar"]

SIDECAR = "lookup.sqlite"

_SCHEMA = (
    "CREATE TABLE entries (value TEXT NOT NULL, key TEXT NOT NULL, partition INTEGER NOT NULL, "
    "seqno INTEGER NOT NULL, PRIMARY KEY (value, key, seqno)) WITHOUT ROWID",
    "CREATE TABLE keys (key TEXT NOT NULL, partition INTEGER NOT NULL, "
    "PRIMARY KEY (key, partition)) WITHOUT ROWID",
)

#: Rows per ``executemany`` call: bounds the Python lists built from one Arrow slice.
_CHUNK = 65_536


def write_sidecar(where: Location, rel: str, table: Any) -> None:
    """Write ``rel``/``SIDECAR`` holding ``table``'s rows (the run's, ``ENTRY_ARROW_FIELDS``).

    Built in a temporary file of the run directory, fsynced, then moved to its name: a crash
    leaves no half-written sidecar under the name (the manifest, written later, is the commit)."""
    final = where.path(f"{rel}/{SIDECAR}")
    fd, tmp = tempfile.mkstemp(prefix=".lookup-", suffix=".tmp", dir=os.path.dirname(final))
    os.close(fd)
    try:
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            for ddl in _SCHEMA:
                db.execute(ddl)
            db.execute("BEGIN")
            entries = table.filter(table["value"].is_valid()).sort_by(
                [("value", "ascending"), ("key", "ascending"), ("seqno", "ascending")])
            for chunk in _chunks(entries, ("value", "key", "partition", "seqno")):
                db.executemany("INSERT OR IGNORE INTO entries VALUES (?, ?, ?, ?)", chunk)
            keys = table.select(["key", "partition"]).sort_by([("key", "ascending"), ("partition", "ascending")])
            for chunk in _chunks(keys, ("key", "partition")):
                db.executemany("INSERT OR IGNORE INTO keys VALUES (?, ?)", chunk)
            db.execute("COMMIT")
        finally:
            db.close()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _chunks(table: Any, columns: tuple[str, ...]) -> Any:
    for start in range(0, table.num_rows, _CHUNK):
        part = table.slice(start, _CHUNK)
        yield zip(*(part[c].to_pylist() for c in columns))


def seal_run(where: Location, rel: str, resets: tuple[int, ...] = ()) -> Run:
    """The manifest entry of the complete run at ``rel``: its row count (from the Parquet files)
    and, for a local index, its lookup sidecar, written now."""
    if not where.is_local:
        from .runfiles import parquet_rows
        return Run(rel, tuple(resets), parquet_rows(where, rel))
    from .runfiles import read_run
    table = read_run(where, rel)
    write_sidecar(where, rel, table)
    return Run(rel, tuple(resets), table.num_rows, SIDECAR)


class Sidecar:
    """One run's sidecar, opened read-only; close it after use."""

    def __init__(self, path: str) -> None:
        from urllib.parse import quote
        # immutable: a run's files never change once a manifest names them (no locks, no journal)
        self._db = sqlite3.connect(f"file:{quote(path)}?mode=ro&immutable=1", uri=True)

    def entries(self, value: str) -> list[tuple[str, int, int]]:
        """``(key, partition, seqno)`` of the run's rows whose value is ``value``."""
        return self._db.execute("SELECT key, partition, seqno FROM entries WHERE value = ?", (value,)).fetchall()

    def holders(self, keys: list[str]) -> list[tuple[str, int]]:
        """``(key, partition)`` of the run's rows (entries or markers) whose key is in ``keys``."""
        import json
        return self._db.execute("SELECT key, partition FROM keys WHERE key IN (SELECT value FROM json_each(?))",
                                (json.dumps(keys),)).fetchall()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Sidecar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
