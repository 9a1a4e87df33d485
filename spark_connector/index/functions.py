"""Index functions: from a document to its index entries.

An index function is any picklable callable ``(key: str, value: bytes) -> Iterable[str]``; it runs
on executors (shipped by cloudpickle), once per changed document.  Returning no entries is fine
(the document is simply not in the index).  ``FieldIndex`` is the built-in one behind
``upr index run --field PATH``; custom indexes pass their own function to ``IndexJob``.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

IndexFunction = Callable[[str, bytes], Iterable[str]]


def render(value: Any) -> str | None:
    """How a JSON value becomes an index value: strings as-is, other scalars in JSON text
    (``true``, ``12``, ``1.5``), objects as compact sorted JSON; null is not indexed."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return json.dumps(value)


@dataclass(frozen=True)
class FieldIndex:
    """Index a JSON field path such as ``address.city``.  An array at the path indexes each
    element (a multi-entry index); a document that is not a JSON object, or lacks the path, has
    no entries."""

    path: str

    def __post_init__(self) -> None:
        if not self.path or any(not part for part in self.path.split(".")):
            raise ValueError(f"field path {self.path!r} must be dot-separated non-empty names")

    @property
    def spec(self) -> dict[str, str]:
        return {"kind": "field", "path": self.path}

    def __call__(self, key: str, value: bytes) -> list[str]:
        try:
            doc = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            return []
        for part in self.path.split("."):
            if not isinstance(doc, dict) or part not in doc:
                return []
            doc = doc[part]
        items = doc if isinstance(doc, list) else [doc]
        out = []
        for item in items:
            text = render(item)
            if text is not None and text not in out:
                out.append(text)
        return out


def spec_of(function: IndexFunction, name: str | None = None) -> dict[str, str]:
    """What the manifest records about the function, so a later run cannot silently switch it."""
    spec = getattr(function, "spec", None)
    if spec is not None:
        return dict(spec)
    return {"kind": "custom", "name": name or getattr(function, "__qualname__", repr(function))}
