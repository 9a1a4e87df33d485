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
import re
import time
from dataclasses import dataclass, field

from bench.cluster_figures import summary_ms

__all__ = ["HandoverMarks", "PhaseWatch", "PHASES", "SwitchStamps", "phase_rows", "etcd_counts", "fence_steps", "step_rows",
           "switch_rows", "switch_traces"]


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


#: a source's fence line ends with its steps: "...; catch-up 0 ms, stop 1 ms, ack of 1 item(s) 9 ms, switch 31 ms"
_FENCE = re.compile(r"stopped taking writes at seqno \d+.*; (?P<steps>(?:[a-z -]+(?: of \d+ item\(s\))? \d+ ms(?:, )?)+)$")
_STEP = re.compile(r"(?P<name>[a-z -]+?)(?: of (?P<items>\d+) item\(s\))? (?P<ms>\d+) ms")
#: a target's takeover line: "..., 12 ms after the map came, 0 ms of them in take_over)"
_TAKEOVER = re.compile(r"taken over as active .*?(?P<after>\d+) ms after the map came, (?P<own>\d+) ms of them in take_over")


def fence_steps(log_lines: list[str]) -> dict[str, list[float]]:
    """Milliseconds of each step of every fence and takeover the nodes logged: the source's
    catch-up (writes still going), stop, the target's acknowledgement of the last items
    ("ack"), the etcd transaction from send to answer ("switch", or "record" when the fence
    was recorded alone), and the target's wait from the map's arrival to its takeover.  The
    items the last acknowledgement covered are under "ack items"."""
    out: dict[str, list[float]] = {}
    for line in log_lines:
        line = line.rstrip()
        fence = _FENCE.search(line)
        if fence is not None:
            for step in _STEP.finditer(fence.group("steps")):
                name = step.group("name").strip()
                out.setdefault(f"source: {name}", []).append(float(step.group("ms")))
                if step.group("items") is not None:
                    out.setdefault("source: ack items", []).append(float(step.group("items")))
            continue
        takeover = _TAKEOVER.search(line)
        if takeover is not None:
            out.setdefault("target: map came -> taken over", []).append(float(takeover.group("after")))
            out.setdefault("target: in take_over", []).append(float(takeover.group("own")))
    return out


def step_rows(steps: dict[str, list[float]]) -> list[tuple[str, str]]:
    """(step, "p50 / p99 / max over n") for ``fence_steps``' figures."""
    rows = []
    for name, values in steps.items():
        s = summary_ms(sorted(v / 1000 for v in values)) if "items" not in name else None
        if s is None:
            values = sorted(values)
            rows.append((name, f"median {values[len(values) // 2]:.0f}, max {values[-1]:.0f} over {len(values)}"))
        else:
            rows.append((name, f"p50 {s['p50']:.0f} ms, p99 {s['p99']:.0f} ms, max {s['p100']:.0f} ms over {len(values)}"))
    return rows


@dataclass
class SwitchStamps:
    """One switch transaction's stamps, parsed from the source's ``switch trace`` line."""

    committed: bool
    #: step -> milliseconds: acquired, sent, answered, read, resumed, total, loop stalled, gc
    ms: dict[str, float]
    line: str


_TRACE = re.compile(r"node (?P<node>\S+): partition (?P<p>\d+): switch trace \((?P<outcome>committed|refused)\): "
                    r"(?P<rest>.*)$")
_TRACE_STEP = re.compile(r"(?P<name>acquired|sent|answered|read|resumed|total|loop stalled|longest|gen\d) "
                         r"(?P<ms>\d+) ms")


def switch_traces(log_lines: list[str]) -> list[SwitchStamps]:
    """Every ``switch trace`` line the sources logged (``UPR_SWITCH_TRACE=1``), in log order."""
    out = []
    for line in log_lines:
        m = _TRACE.search(line.rstrip())
        if m is None:
            continue
        ms: dict[str, float] = {}
        for step in _TRACE_STEP.finditer(m.group("rest")):
            name = "gc" if step.group("name").startswith("gen") else step.group("name")
            ms[name] = ms.get(name, 0.0) + float(step.group("ms"))
        out.append(SwitchStamps(m.group("outcome") == "committed", ms,
                                f"{m.group('node')} p{m.group('p')} {m.group('outcome')}: {m.group('rest')}"))
    return out


def switch_rows(traces: list[SwitchStamps]) -> list[tuple[str, str]]:
    """(step, "p50 / p99 / max over n") over every traced switch transaction, committed or refused."""
    rows = []
    for name in ("total", "acquired", "sent", "answered", "read", "resumed", "loop stalled", "gc"):
        values = sorted(t.ms.get(name, 0.0) / 1000 for t in traces)
        if not values:
            continue
        s = summary_ms(values)
        rows.append((name, f"p50 {s['p50']:.0f} ms, p99 {s['p99']:.0f} ms, max {s['p100']:.0f} ms over {len(values)}"))
    return rows


_STALL = re.compile(r"loop stalled (?P<ms>\d+) ms from (?P<at>[\d.]+) \(monotonic\)")


def loop_stalls(log_lines: list[str]) -> list[tuple[float, float]]:
    """(start, end) in monotonic seconds of every loop stall one node logged (``UPR_SWITCH_TRACE``
    logs those over 50 ms)."""
    out = []
    for line in log_lines:
        m = _STALL.search(line)
        if m is not None:
            start = float(m.group("at"))
            out.append((start, start + float(m.group("ms")) / 1000))
    return out


def stall_rows(marks: dict[int, HandoverMarks], moved: list[int],
               stalls: dict[str, list[tuple[float, float]]]) -> list[tuple[str, str]]:
    """Per moved partition: its pause (first refused write -> accepted), then how much of
    "map switched -> target took over" the target's loop spent in stalls over 50 ms, and how
    much of the pause the source's did."""
    rows = []
    for p in moved:
        m = marks.get(p)
        if m is None or m.switched is None or m.taken_over is None:
            continue

        def within(node: str, lo: float | None, hi: float | None) -> float:
            if lo is None or hi is None:
                return float("nan")
            return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in stalls.get(node, [])) * 1000

        pause = (m.accepted - m.first_refused) * 1000 if m.accepted and m.first_refused else float("nan")
        rows.append((f"partition {p} ({m.source} -> {m.target})",
                     f"pause {pause:.0f} ms; map switched -> target took over {(m.taken_over - m.switched) * 1000:.0f} ms, "
                     f"target's loop stalled {within(m.target, m.switched, m.taken_over):.0f} ms of it; "
                     f"source's loop stalled {within(m.source, m.first_refused, m.accepted):.0f} ms of the pause"))
    return rows
