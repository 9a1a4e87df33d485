"""Two orchestrators racing: the orchestrator's node is paused (SIGSTOP) past its lease TTL, another
node takes the role and publishes a new map, then the paused node resumes (SIGCONT).

Checked as a history (the Jepsen way): every write of the map key in etcd, replayed from the
start, is one sequence of revisions 1, 2, 3, ... (never two maps of one revision), every node
ends on the newest one, and at no moment does a partition have two nodes accepting writes: not
while the old orchestrator is paused, not for the writes that were waiting in its sockets when it
resumed, and not afterwards."""
from __future__ import annotations

import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.faults import accepting, assert_one_history, keys_per_partition, map_history
from tests.cluster.nodes import Cluster, started_in_sync, until

pytestmark = pytest.mark.slow

PARTITIONS = 8
TTL_S = 3  # a loaded machine can delay a keep-alive past a 2 s lease


def _one_writer_each(cluster: Cluster, names: list[str], keys: dict[int, str], tag: str) -> dict[int, list[str]]:
    """Poll until every partition has exactly one node accepting writes (never two meanwhile)."""
    def settled() -> dict[int, list[str]] | None:
        statuses: dict[tuple[int, str], int] = {}
        accepted = accepting(cluster, names, keys, tag, statuses=statuses)
        assert all(len(nodes) <= 1 for nodes in accepted.values()), (accepted, statuses)
        return accepted if all(len(nodes) == 1 for nodes in accepted.values()) else None

    return until(settled, what=f"one writer per partition ({tag})")


def test_a_paused_orchestrator_never_forks_the_map_or_leaves_two_writers(tmp_path: Path, etcd: EtcdProcess) -> None:
    prefix = f"/upr/{uuid.uuid4().hex[:8]}"
    cluster = Cluster(tmp_path, etcd.url, partitions=PARTITIONS, replicas=1, initial_nodes=3, prefix=prefix,
                      lease_ttl_s=TTL_S)
    keys = keys_per_partition(PARTITIONS)
    names = ["n1", "n2", "n3"]
    try:
        view = started_in_sync(cluster, names, [f"doc-{i}" for i in range(100)])
        old = until(lambda: cluster.view("n1")["orchestrator"], what="an orchestrator elected")
        owned = [p["partition"] for p in view["map"]["partitions"] if p["active"] == old]
        assert owned, "a balanced first map gives every node actives"
        others = [n for n in names if n != old]
        _one_writer_each(cluster, names, keys, "before")

        cluster.nodes[old].proc.send_signal(signal.SIGSTOP)
        try:
            def taken_over() -> dict | None:
                v = cluster.view(others[0])
                moved = all(v["map"]["partitions"][p]["active"] in others for p in owned)
                return v if v["orchestrator"] in others and moved else None

            after = until(taken_over, timeout=60, what="another orchestrator failing the paused node over")
            _one_writer_each(cluster, others, keys, "paused")
            # writes waiting in the paused node's sockets when it resumes: it must refuse every one
            stale: dict[int, list[str]] = {}
            waiting = threading.Thread(target=lambda: stale.update(accepting(cluster, [old], keys, "stale")))
            waiting.start()
            time.sleep(1.0)
        finally:
            cluster.nodes[old].proc.send_signal(signal.SIGCONT)
        waiting.join(timeout=60)
        assert not waiting.is_alive()
        assert all(nodes == [] for nodes in stale.values()), stale

        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # the resumed node finds out and follows the new map
            statuses: dict[tuple[int, str], int] = {}
            round_ = accepting(cluster, names, keys, "after", statuses=statuses)
            assert all(len(nodes) <= 1 for nodes in round_.values()), (round_, statuses)

        history = map_history(etcd.url, prefix)
        assert_one_history(history)
        newest = history[-1][1]
        assert newest >= after["map"]["revision"]
        until(lambda: all(cluster.view(n)["map"]["revision"] == newest for n in names),
              what="every node on the newest map")
        # the map is followed from its watch event, the orchestrator key on the refresh after it
        until(lambda: cluster.view(old)["orchestrator"] in others, what="the resumed node naming the new orchestrator")
        _one_writer_each(cluster, names, keys, "final")
    finally:
        for node in cluster.nodes.values():
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
        cluster.stop_all()
