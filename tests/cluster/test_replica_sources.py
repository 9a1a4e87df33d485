"""``app.cluster.node.replica_sources``: which copies a node replicates, and from where.  A dead
active's partitions stay listed until the map moves them, so the replica's progress stays in etcd
for the orchestrator that promotes it."""
from __future__ import annotations

import pytest

from app.cluster.node import replica_sources
from engine.cluster.partition_map import PartitionMap, Placement

MAP = PartitionMap(3, (Placement("n1", ("n2",)), Placement("n2", ("n1",)), Placement("n3", ("n2",)),
                       Placement(None, ("n2",)), Placement("n1", ())))
URLS = {"n1": "http://a", "n2": "http://b", "n3": "http://c"}


@pytest.mark.parametrize(
    ("me", "urls", "expected"),
    [
        ("n2", URLS, {0: ("n1", "http://a"), 2: ("n3", "http://c")}),
        ("n1", URLS, {1: ("n2", "http://b")}),
        ("n3", URLS, {}),
        # n3 never seen (a node that started after it died): nothing to stream from
        ("n2", {"n1": "http://a", "n2": "http://b"}, {0: ("n1", "http://a")}),
    ],
)
def test_replica_sources(me: str, urls: dict[str, str], expected: dict) -> None:
    assert replica_sources(MAP, me, urls) == expected
