"""Events found by comparing successive observations of the node (pure, stdlib only).

WHY observe rather than hook: promotions, failovers, takeovers and flush faults each happen in a
module that other work changes in parallel (the engine's flusher thread, the cluster's
orchestrator and handover code), and the engine may not import the app.  The state they change is
public (partition states and failover logs, the flusher's fault, the cluster view), so one
comparison per tick finds every change whoever made it, and a change too brief to see between
two ticks left no state an operator could act on anyway.  Changes made in one step (a node's
failover moves hundreds of partitions) become one event naming the partitions, not hundreds.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.events import EventKind, Severity


@dataclass(frozen=True, slots=True)
class PartitionFacts:
    partition: int
    state: str
    #: the newest failover entry: a new one means a new history branch began here
    branch: tuple[int, int]


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    #: node name -> "up" / "down"
    nodes: Mapping[str, str]
    #: partition -> (active node or None, replica node names)
    placement: Mapping[int, tuple[str | None, tuple[str, ...]]]
    revision: int = 0


@dataclass(frozen=True, slots=True)
class Observation:
    node: str
    partitions: tuple[PartitionFacts, ...]
    #: why flushing fails right now, or None
    flush_fault: str | None = None
    cluster: ClusterFacts | None = None


@dataclass(frozen=True, slots=True)
class Found:
    """An event to record: the arguments of ``EventLog.record``."""

    kind: EventKind
    message: str
    severity: Severity = Severity.INFO
    partition: int | None = None
    node: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


def ranges(numbers: Iterable[int]) -> str:
    """``0-3, 7, 9-10``: partition lists an operator reads at 1024 partitions."""
    out: list[str] = []
    ordered = sorted(set(numbers))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def _grouped(kind: EventKind, severity: Severity, node: str | None, parts: list[int], text: str,
             details: Mapping[str, Any]) -> Found:
    one = parts[0] if len(parts) == 1 else None
    label = f"partition {one}" if one is not None else f"{len(parts)} partitions ({ranges(parts)})"
    return Found(kind, f"{label}: {text}", severity, one, node, {**details, "partitions": sorted(parts)})


class StateWatch:
    """Fed one ``Observation`` per tick; returns what changed since the previous one."""

    def __init__(self) -> None:
        self._last: Observation | None = None

    def observe(self, now: Observation) -> list[Found]:
        before, self._last = self._last, now
        if before is None:
            return []
        found = self._partitions(before, now)
        found += self._flush(before, now)
        if before.cluster is not None and now.cluster is not None:
            found += self._cluster(before.cluster, now.cluster)
        return found

    @staticmethod
    def _partitions(before: Observation, now: Observation) -> list[Found]:
        old = {p.partition: p for p in before.partitions}
        promoted: dict[tuple[str, str], list[int]] = defaultdict(list)
        changed: dict[tuple[str, str], list[int]] = defaultdict(list)
        branched: list[int] = []
        for p in now.partitions:
            was = old.get(p.partition)
            if was is None:
                continue
            if p.state != was.state:
                target = promoted if p.state == "active" and p.branch != was.branch else changed
                target[(was.state, p.state)].append(p.partition)
            elif p.branch != was.branch:
                branched.append(p.partition)
        found = []
        for (src, dst), parts in sorted(promoted.items()):
            found.append(_grouped(EventKind.PROMOTION, Severity.WARNING, now.node, parts,
                                  f"promoted {src} -> active on node {now.node}, new failover entry",
                                  {"from": src, "to": dst}))
        for (src, dst), parts in sorted(changed.items()):
            found.append(_grouped(EventKind.STATE, Severity.INFO, now.node, parts,
                                  f"state {src} -> {dst} on node {now.node}", {"from": src, "to": dst}))
        if branched:
            found.append(_grouped(EventKind.PROMOTION, Severity.WARNING, now.node, branched,
                                  f"new failover entry (history branch) on node {now.node}", {}))
        return found

    @staticmethod
    def _flush(before: Observation, now: Observation) -> list[Found]:
        if now.flush_fault and now.flush_fault != before.flush_fault:
            return [Found(EventKind.FLUSH_ERROR, f"flushing to disk fails on node {now.node}: {now.flush_fault}",
                          Severity.ERROR, None, now.node, {"fault": now.flush_fault})]
        if before.flush_fault and not now.flush_fault:
            return [Found(EventKind.FLUSH_RECOVERED, f"flushing to disk works again on node {now.node}",
                          Severity.INFO, None, now.node, {"fault": before.flush_fault})]
        return []

    @staticmethod
    def _cluster(before: ClusterFacts, now: ClusterFacts) -> list[Found]:
        found = []
        for name, state in sorted(now.nodes.items()):
            if before.nodes.get(name) != state:
                verb = "joined" if name not in before.nodes else f"is {state}"
                found.append(Found(EventKind.NODE, f"node {name} {verb}",
                                   Severity.WARNING if state == "down" else Severity.INFO, None, name,
                                   {"state": state}))
        for name in sorted(set(before.nodes) - set(now.nodes)):
            found.append(Found(EventKind.NODE, f"node {name} left the cluster", Severity.INFO, None, name, {}))
        moved: dict[tuple[EventKind, str | None, str | None], list[int]] = defaultdict(list)
        replicas_changed: list[int] = []
        for p, (active, replicas) in now.placement.items():
            old = before.placement.get(p)
            if old is None:
                continue
            old_active, old_replicas = old
            if active != old_active and old_active is None:
                moved[(EventKind.REBALANCE, old_active, active)].append(p)  # placed, nothing moved
            elif active != old_active:
                lost = now.nodes.get(old_active) != "up"
                moved[(EventKind.FAILOVER if lost else EventKind.TAKEOVER, old_active, active)].append(p)
            elif set(replicas) != set(old_replicas):
                replicas_changed.append(p)
        for (kind, src, dst), parts in sorted(moved.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), str(kv[0][2]))):
            if kind is EventKind.FAILOVER:
                text = f"failed over from node {src} (down) to {dst or 'no node'}"
            elif kind is EventKind.REBALANCE:
                text = f"active placed on node {dst}"
            else:
                text = f"active moved from node {src or 'none'} to {dst or 'none'}"
            found.append(_grouped(kind, Severity.INFO if kind is EventKind.REBALANCE else Severity.WARNING, dst, parts, text,
                                  {"from": src, "to": dst, "revision": now.revision}))
        if replicas_changed:
            found.append(_grouped(EventKind.REBALANCE, Severity.INFO, None, replicas_changed,
                                  f"replicas changed (map revision {before.revision} -> {now.revision})",
                                  {"revision": now.revision}))
        return found


def cluster_facts(view: Mapping[str, Any]) -> ClusterFacts:
    """The parts of ``GET /cluster``'s view the watch compares."""
    nodes = {n["name"]: n["state"] for n in view.get("nodes", ())}
    cmap = view.get("map", {}) or {}
    placement = {
        p["partition"]: (p.get("active"), tuple(r["node"] for r in p.get("replicas", ())))
        for p in cmap.get("partitions", ())
    }
    return ClusterFacts(nodes, placement, int(cmap.get("revision", 0) or 0))
