"""A failed node of a three-node cluster rejoins as a replica within the replace grace.

Three nodes, 16 partitions, 1 replica, lease TTL 6 s, the default 60 s grace: the node that is
active for some partitions takes ``memory`` writes its replicas may not have (their node is
paused) and is SIGKILLed.  Its partitions are promoted on their replicas and it keeps a (dead,
out-of-sync) replica slot of everything it held, so no copy streams to another node meanwhile.
Restarted within the grace it streams from each active, rolls back what the failover took from
it by undo (never by a resync from 0: its ``GET /metrics`` counts which), is in sync again, and
ends with each active's by-seqno history item for item (seqno, key, cas, rev, deleted, value).
Promotion never chose its dead slot.
"""
from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster, first_map, following, replicas_caught_up, until, write_routed
from tests.cluster.test_replication import history

pytestmark = pytest.mark.slow

PARTITIONS = 16
#: longer than the pause below takes on a loaded machine, so the paused node keeps its lease
LEASE_TTL_S = 6


def test_a_killed_node_restarted_within_the_grace_rolls_back_every_copy_it_held(tmp_path: Path,
                                                                          etcd: EtcdProcess) -> None:
    cluster = Cluster(tmp_path, etcd.url, partitions=PARTITIONS, replicas=1, initial_nodes=3, lease_ttl_s=LEASE_TTL_S,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        cluster.start_all(("n1", "n2", "n3"))
        view = first_map(cluster, "n1")
        keys = [f"doc-{i}" for i in range(300)]
        write_routed(cluster, view, keys, "v1")
        until(lambda: replicas_caught_up(cluster), what="every replica in sync")

        victim = "n1"
        placements = view["map"]["partitions"]
        owned = [p["partition"] for p in placements if p["active"] == victim]
        held = {p["partition"] for p in placements if victim in [r["node"] for r in p["replicas"]]}
        assert owned and held
        # writes on the victim that its replicas' node, paused for less than a lease, may never get
        paused = placements[owned[0]]["replicas"][0]["node"]
        cluster.nodes[paused].proc.send_signal(signal.SIGSTOP)
        try:
            extra = [k for k in keys if placements[_partition(k)]["active"] == victim][:40]
            # 12 MB: more than the replication stream's flow-control window (8 MB), so the paused
            # node cannot have them all, even from its socket buffers after SIGCONT
            big = [{"op": "set", "key": k, "value": "lost-maybe " + "x" * (1 << 20)} for k in extra[:12]]
            r = httpx.post(f"{cluster.nodes[victim].url}/docs/_bulk", json=big, timeout=120)
            assert r.status_code == 200 and r.json()["succeeded"] == len(big), r.text[:300]
            # on its disk, so the restarted node holds them and must roll them back
            assert httpx.post(f"{cluster.nodes[victim].url}/admin/flush", timeout=60).status_code == 200
            cluster.nodes[victim].kill()
        finally:
            cluster.nodes[paused].proc.send_signal(signal.SIGCONT)

        survivor = next(n for n in ("n2", "n3") if n != victim)

        def failed_over() -> dict | None:
            v = cluster.view(survivor)
            moved = all(v["map"]["partitions"][p]["active"] not in (None, victim) for p in owned)
            return v if moved else None

        after = until(failed_over, timeout=60, what="the failover of the killed node's partitions")
        until(lambda: following(cluster, survivor), what="the survivors following the new map")
        for entry in after["map"]["partitions"]:
            p = entry["partition"]
            copies = [entry["active"], *(r["node"] for r in entry["replicas"])]
            if p in owned or p in held:
                # its slot is kept (dead, out of sync) and nothing was placed elsewhere for it
                assert copies[1:] == [victim], (p, copies)
                assert not entry["replicas"][0]["in_sync"]
            else:
                assert victim not in copies
        write_routed(cluster, after, keys[:60], "v2")  # history the victim never saw

        started = time.monotonic()
        cluster.start(victim)
        until(lambda: replicas_caught_up(cluster), timeout=90, what="the restarted node in sync again")
        final = cluster.view(survivor)
        assert time.monotonic() - started < 60  # it came back within the default grace
        # the copies it held as active rolled back by undo, none by a resync from 0
        rollbacks = _rollbacks(cluster.nodes[victim].url)
        assert rollbacks["undo"] >= 1 and rollbacks["resync"] == 0, rollbacks
        assert final["map"]["revision"] == after["map"]["revision"]  # no map change was needed
        for name in cluster.live():
            # a clean exit (the histories below are read from the data dirs); the last node stops
            # while it fails the others' partitions over, which on a loaded machine has taken
            # longer than the default 20 s
            node = cluster.nodes[name]
            assert node.stop(timeout=60) in (0, -15), (name, node.log_path.read_text()[-8000:])
        scans = {name: history(cluster.nodes[name].data_dir, PARTITIONS)[0] for name in ("n1", "n2", "n3")}
        assert sum(map(len, scans[final["map"]["partitions"][0]["active"]].values())) > 0
        for entry in final["map"]["partitions"]:
            p = entry["partition"]
            if p in owned or p in held:
                assert scans[victim][p] == scans[entry["active"]][p], p
                assert scans[victim][p], p
    finally:
        cluster.stop_all()


def _rollbacks(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {s.labels["path"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "upr_cluster_replica_rollbacks_total"}


def _partition(key: str) -> int:
    from tests.cluster.nodes import partition_of

    return partition_of(key, PARTITIONS)
