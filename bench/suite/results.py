"""Result rows, the one table the suite prints, and the JSON it writes.

Every row is one workload on one system with one headline figure (``value`` in ``unit``), the
other figures in ``metrics``, and a status: ``ok``, ``skipped`` (with the reason: the system could
not be installed or started) or ``error`` (it started but the workload failed; the message says
how). The "upr advantage" column is the same-run ratio that makes figures comparable across
machines: how many times better upr's headline figure is than this row's (above 1: upr ahead).
Limit rows instead show upr's figure as a fraction of the machine's limit.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "skipped", "error"]
Better = Literal["higher", "lower"]


@dataclass
class Row:
    workload: str
    system: str
    value: float | None = None
    unit: str = ""
    better: Better = "higher"
    metrics: dict[str, float] = field(default_factory=dict)
    detail: str = ""
    status: Status = "ok"
    reason: str = ""
    compare_to: str | None = None  # limit rows: the workload of upr's row shown as a fraction of this one

    def __post_init__(self) -> None:
        if self.status != "ok":
            return
        floor_ok = self.value is not None and (self.value > 0 or (self.better == "lower" and self.value == 0))
        if self.value is None or not math.isfinite(self.value) or not floor_ok:
            raise ValueError(f"{self.workload}/{self.system}: an ok row needs a finite positive value: {self.value}")


def advantage(ours: Row, other: Row) -> float | None:
    """How many times better upr's figure is than ``other``'s (None when either is missing)."""
    if ours.status != "ok" or other.status != "ok" or not ours.value or not other.value:
        return None
    return ours.value / other.value if ours.better == "higher" else other.value / ours.value


def fmt_value(v: float | None) -> str:
    if v is None:
        return "—"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 0.1:
        return f"{v:.2f}"
    return f"{v:.3f}"


@dataclass
class Report:
    meta: dict[str, Any] = field(default_factory=dict)
    systems: dict[str, dict[str, Any]] = field(default_factory=dict)
    installs: list[dict[str, Any]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def ours(self, workload: str) -> Row | None:
        for r in self.rows:
            if r.workload == workload and r.system == "upr":
                return r
        return None

    def ratio_text(self, row: Row) -> str:
        if row.compare_to is not None:
            ours = self.ours(row.compare_to)
            if ours is None or ours.status != "ok" or row.status != "ok" or ours.value is None or row.value is None:
                return "—"
            return f"upr {row.compare_to} at {100 * ours.value / row.value:.1f}%"
        if row.system == "upr":
            return "1×" if row.status == "ok" else "—"
        ours = self.ours(row.workload)
        adv = advantage(ours, row) if ours is not None else None
        return "—" if adv is None else f"{adv:.2f}×"

    def table(self, notes: bool = True) -> str:
        """The pipe table (Markdown); ``notes=False`` leaves out the long notes column."""
        head = ["workload", "system", "result", "unit", "upr advantage", "notes"]
        lines = [head]
        for r in self.rows:
            result = fmt_value(r.value) if r.status == "ok" else r.status
            note = r.detail if r.status == "ok" else r.reason
            lines.append([r.workload, r.system, result, r.unit, self.ratio_text(r), note])
        if not notes:
            lines = [line[:-1] for line in lines]
        # every column but a last notes column is padded, so the table also reads as plain text
        padded = len(lines[0]) - 1 if notes else len(lines[0])
        widths = [max(len(line[i]) for line in lines) for i in range(padded)]
        out = []
        for n, line in enumerate(lines):
            cells = [c.ljust(w) for c, w in zip(line, widths, strict=False)] + line[padded:]
            out.append("| " + " | ".join(cells) + " |")
            if n == 0:
                out.append("|" + "|".join("-" * (w + 2) for w in widths) + ("|---|" if notes else "|"))
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        rows = []
        for r in self.rows:
            d = asdict(r)
            d["upr_advantage"] = self.ratio_text(r)
            rows.append(d)
        return {"meta": self.meta, "systems": self.systems, "installs": self.installs, "rows": rows}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        fields = set(Row.__dataclass_fields__)
        rows = [Row(**{k: v for k, v in r.items() if k in fields}) for r in data["rows"]]
        return cls(meta=data["meta"], systems=data["systems"], installs=data.get("installs", []), rows=rows)

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n")
