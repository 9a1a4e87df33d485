"""Where a takeover's write pause goes: each handover's steps as etcd shows them, timed on the
bench's clock beside what the writing probe saw.

The bench watches the cluster's prefix in etcd itself (one more watcher, like every node's) and
notes, per partition, when its takeover record appeared (the orchestrator started it), when the
record carried ``fenced_at`` (the source stopped writes and recorded its seqno), when a map named
the target active (the switch) and when the record went (the target took over).  The probe adds
its own marks: when its first refused write was sent, when its first 421 came back, and its
next accepted write.  Each phase
is the time between two marks (some overlap: the source's fence and the probe's refusals
run side by side), and the phase that dominates is the step to shorten.  The watch's own delivery (a few ms on loopback)
shifts every etcd mark alike.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from bench.cluster_figures import summary_ms

__all__ = ["HandoverMarks", "PhaseWatch", "PHASES", "phase_rows", "etcd_counts"]


@dataclass
class HandoverMarks:
    """Monotonic seconds of each mark of one partition's handover (None: not seen)."""

    source: str = ""
    target: str = ""
    created: float | None = None
    fenced: float | None = None
    switched: float | None = None
    taken_over: float | None = None
    first_refused: float | None = None
    first_misdirected: float | None = None
    #: when the write that was accepted was sent (after the 421: the hop to the target)
    accepted_sent: float | None = None
    accepted: float | None = None


#: (label, from mark, to mark): the chain of one handover, in order
PHASES = (
    ("record -> fence recorded", "created", "fenced"),
    ("record -> first refused write sent", "created", "first_refused"),
    ("fence recorded -> map switched", "fenced", "switched"),
    ("map switched -> target took over", "switched", "taken_over"),
    ("map switched -> probe's first 421", "switched", "first_misdirected"),
    ("map switched -> probe's accepted write", "switched", "accepted"),
    ("target took over -> probe's accepted write", "taken_over", "accepted"),
    ("probe's first 421 -> accepted write", "first_misdirected", "accepted"),
    ("probe's first 421 -> accepted write sent", "first_misdirected", "accepted_sent"),
    ("accepted write sent -> answered", "accepted_sent", "accepted"),
    ("first refused write sent -> accepted", "first_refused", "accepted"),
)


@dataclass
class PhaseWatch:
    """Watches ``prefix`` in etcd and fills ``marks`` per partition from the events."""

    etcd_url: str
    prefix: str
    marks: dict[int, HandoverMarks] = field(default_factory=dict)

    async def run(self, ready: asyncio.Event) -> None:
        from app.cluster.etcd import EtcdClient  # the nodes' own client: the same gateway, same JSON

        root = self.prefix.rstrip("/")
        records = f"{root}/handover/partitions/".encode()
        map_key = f"{root}/map".encode()
        etcd = EtcdClient([self.etcd_url])
        actives: dict[int, str] = {}
        try:
            kv = await etcd.get(map_key)
            if kv is not None:
                actives = _actives(kv.value)
            _, revision = await etcd.get_prefix(root.encode() + b"/")
            ready.set()
            async for event in etcd.watch_prefix(root.encode() + b"/", revision + 1):
                now = time.monotonic()
                key = event.kv.key
                if key.startswith(records):
                    p = int(key[len(records):])
                    marks = self.marks.setdefault(p, HandoverMarks())
                    if event.kind == "delete":
                        marks.taken_over = marks.taken_over or now
                        continue
                    record = json.loads(event.kv.value)
                    marks.source, marks.target = record["source"], record["target"]
                    marks.created = marks.created or now
                    if record.get("fenced_at") is not None:
                        marks.fenced = marks.fenced or now
                elif key == map_key and event.kind == "put":
                    new = _actives(event.kv.value)
                    for p, node in new.items():
                        marks = self.marks.get(p)
                        if marks is not None and node == marks.target and actives.get(p) != node:
                            marks.switched = marks.switched or now
                    actives = new
        finally:
            await etcd.aclose()

    def probe_refused(self, p: int, status: int, sent: float, answered: float) -> None:
        """A refused write: sent at ``sent`` (the refusal's mark: a source may hold a write
        paused by its handover until the switch), answered at ``answered`` (the 421's mark)."""
        marks = self.marks.get(p)
        if marks is None or marks.created is None:
            return  # refused before this partition's handover began: not part of its pause
        marks.first_refused = marks.first_refused or sent
        if status == 421:
            marks.first_misdirected = marks.first_misdirected or answered

    def probe_accepted(self, p: int, now: float, sent: float | None = None) -> None:
        marks = self.marks.get(p)
        if marks is not None and marks.first_refused is not None and marks.accepted is None:
            marks.accepted, marks.accepted_sent = now, sent


def _actives(raw: bytes) -> dict[int, str]:
    data = json.loads(raw)
    return {int(e["partition"]): e.get("active") for e in data.get("partitions", [])}


def phase_rows(marks: dict[int, HandoverMarks], moved: list[int]) -> list[tuple[str, str]]:
    """(phase, "p50 / p99 / max ms over n") for each phase, over the moved partitions that have
    both marks."""
    rows = []
    for label, a, b in PHASES:
        spans = []
        for p in moved:
            m = marks.get(p)
            if m is None:
                continue
            start, end = getattr(m, a), getattr(m, b)
            if start is not None and end is not None:
                spans.append(end - start)
        if spans:
            s = summary_ms(sorted(spans))
            rows.append((label, f"p50 {s['p50']:.0f} ms, p99 {s['p99']:.0f} ms, max {s['p100']:.0f} ms "
                                f"(min {min(spans) * 1000:.0f} ms) over {len(spans)}"))
        else:
            rows.append((label, "not seen"))
    return rows


async def etcd_counts(client: object, etcd_url: str) -> dict[str, float]:
    """etcd's own counters of the requests it served (``/metrics``): ranges, txns, puts.  Counts
    do not depend on the machine's load, unlike the pause itself."""
    import httpx

    assert isinstance(client, httpx.AsyncClient)
    text = (await client.get(f"{etcd_url}/metrics", timeout=10)).text
    out = {}
    for name in ("range", "txn", "put"):
        for line in text.splitlines():
            if line.startswith(f"etcd_mvcc_{name}_total "):
                out[name] = float(line.split()[1])
    return out
