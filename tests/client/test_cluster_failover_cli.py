"""``upr cluster failover``'s progress lines (pure): one line per step a person can follow."""
from __future__ import annotations

from clients.cluster_failover import progress_lines


def status(active, handovers=(), replica_of=None, revision=3):
    return {"node": "n1", "request": {"node": "n1", "force": False, "refused": None}, "active": list(active),
            "handovers": [dict(partition=p, source="n1", target=t, fenced_at=s) for p, t, s in handovers],
            "replica_of": replica_of or {}, "map_revision": revision}


def test_progress_lines_name_each_step() -> None:
    start = status([0, 3])
    assert progress_lines("n1", None, start) == ["graceful failover of n1: 2 active partition(s) to hand over"]
    fenced = status([0, 3], [(0, "n2", 40), (3, "n3", None)])
    assert progress_lines("n1", start, fenced) == [
        "partition 0: writes stopped on n1 at seqno 40; n2 receiving the rest"]
    assert progress_lines("n1", fenced, fenced) == []
    moved = status([3], [(3, "n3", 12)], replica_of={"0": "n2"}, revision=4)
    assert progress_lines("n1", fenced, moved) == [
        "partition 3: writes stopped on n1 at seqno 12; n3 receiving the rest",
        "partition 0: active on n2 (map revision 4); n1 stays its replica"]
    assert progress_lines("n1", moved, status([], revision=5)) == [
        "partition 3: active elsewhere (map revision 5); n1 holds no copy"]
