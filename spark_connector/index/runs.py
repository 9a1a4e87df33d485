"""The runs of an index generation as ``manifest.json`` lists them, read with the stdlib alone.

``manifest.Manifest`` is the model the job builds and commits.  A reader that needs only the
current generation's runs (a one-shot ``upr index query``) reads them here, without the model:
``dataclasses`` imports ``inspect`` and generates each class's methods from source text, which
costs a new lookup process about half as much CPU as the lookup itself (docs/benchmarks.md,
Spark: what a new ``upr index query`` process spends).  ``Run`` is a plain class for that reason.
"""
from __future__ import annotations

import json

from .errors import IndexError_
from .storage import Location

TYPE_CHECKING = False   # typing only for the checkers: `upr index query` imports this module (docs/benchmarks.md)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["FORMAT", "MANIFEST", "Run", "read_manifest", "runs_from_json"]

FORMAT = 1
MANIFEST = "manifest.json"


class Run:
    """One run of a generation: the Parquet files under ``path`` (relative to the index
    directory), whose rows supersede, key by key, those of older runs.  ``resets``: partitions
    whose older rows the run kills; ``rows``: its row count; ``sidecar``: the name of its lookup
    sidecar in the run directory ("" = none).  Immutable, compared and hashed by value."""

    __slots__ = ("path", "resets", "rows", "sidecar")
    path: str
    resets: tuple[int, ...]
    rows: int
    sidecar: str

    def __init__(self, path: str, resets: tuple[int, ...] = (), rows: int = 0, sidecar: str = "") -> None:
        for name, value in zip(self.__slots__, (path, resets, rows, sidecar)):
            object.__setattr__(self, name, value)

    def _fields(self) -> tuple[str, tuple[int, ...], int, str]:
        return (self.path, self.resets, self.rows, self.sidecar)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of an immutable Run")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of an immutable Run")

    def __eq__(self, other: object) -> bool:
        return other._fields() == self._fields() if isinstance(other, Run) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "Run(path={!r}, resets={!r}, rows={!r}, sidecar={!r})".format(*self._fields())

    def __reduce__(self) -> tuple[type[Run], tuple[str, tuple[int, ...], int, str]]:
        return (Run, self._fields())

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "resets": list(self.resets), "rows": self.rows, "sidecar": self.sidecar}


def runs_from_json(raw: dict[str, Any]) -> tuple[Run, ...]:
    """The runs of a manifest's JSON (``Manifest.to_json``), oldest first."""
    return tuple(Run(r["path"], tuple(r.get("resets", ())), int(r.get("rows", 0)), str(r.get("sidecar", "")))
                 for r in raw["runs"])


def read_manifest(where: Location) -> dict[str, Any] | None:
    """The current manifest of the index at ``where`` (a ``storage.Location``) as JSON, its
    format checked, or None when there is no manifest."""
    try:
        text = where.read_text(MANIFEST)
    except OSError as exc:          # a remote store that cannot be reached: name the index
        from ..redact import redact
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise IndexError_(redact(f"{where.display(MANIFEST)}: cannot read the manifest: {first}")) from None
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise IndexError_(f"{where.display(MANIFEST)}: corrupt manifest ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else None
        raise IndexError_(f"unsupported index format {found!r}")
    return raw
