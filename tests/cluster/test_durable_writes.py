"""Durable writes on a real two-node cluster (real etcd, real ``upr server --cluster`` processes):
the replica acknowledges what it holds (``seqno_ack``), the active acknowledges ``majority`` and
``persist_majority`` writes once the replica holds them and shows the figures in ``GET /cluster``;
with the replica paused (SIGSTOP) a majority write is answered ``durability-ambiguous`` once its
timeout passes, and it was applied on the active."""
from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import httpx
import pytest

from app import cli

from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster, first_map, partition_of, replicas_caught_up, until
from tests.support.problems import problem


def test_majority_writes_wait_for_the_replica_and_are_ambiguous_while_it_is_paused(
        tmp_path: Path, etcd: EtcdProcess, capsys: pytest.CaptureFixture[str]) -> None:
    # a lease far longer than the pause: the paused replica stays in the map and counts as live
    cluster = Cluster(tmp_path, etcd.url, partitions=8, replicas=1, initial_nodes=2, lease_ttl_s=30,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        cluster.start_all(("n1", "n2"))
        view = first_map(cluster, "n1")
        until(lambda: replicas_caught_up(cluster), what="every replica in sync")
        p = next(e["partition"] for e in view["map"]["partitions"] if e["active"] == "n1")
        assert view["map"]["partitions"][p]["replicas"][0]["node"] == "n2"
        key = next(f"doc-{i}" for i in range(1000) if partition_of(f"doc-{i}", 8) == p)
        n1 = cluster.nodes["n1"]

        def replica_of_p(name: str = "n1") -> dict:
            return cluster.view(name)["map"]["partitions"][p]["replicas"][0]

        w = httpx.put(f"{n1.url}/docs/{key}", params={"durability": "majority"}, content=b"one", timeout=60)
        assert w.status_code == 200 and w.json()["durability"] == "majority", w.text
        seqno = w.json()["seqno"]
        assert replica_of_p()["received_seqno"] >= seqno  # acknowledged by the replica before the answer
        w = httpx.put(f"{n1.url}/docs/{key}", params={"durability": "persist_majority"}, content=b"two", timeout=60)
        assert w.status_code == 200 and w.json()["durability"] == "persist_majority", w.text
        seqno = w.json()["seqno"]
        shown = replica_of_p()
        assert shown["persisted_seqno"] >= seqno and shown["received_seqno"] >= shown["persisted_seqno"]
        assert shown["lag"] == 0 and shown["persist_lag"] == 0
        assert replica_of_p("n2")["received_seqno"] is None  # only the active's node holds the acks
        r = httpx.post(f"{n1.url}/docs/_bulk", params={"durability": "majority"},
                       json=[{"op": "set", "key": key, "value": 3}], timeout=60)
        assert r.status_code == 200 and r.json()["durability"] == "majority", r.text

        n2 = cluster.nodes["n2"]
        n2.proc.send_signal(signal.SIGSTOP)
        try:
            r = httpx.put(f"{n1.url}/docs/{key}", params={"durability": "majority", "durability_timeout_ms": 300},
                          content=b"four", timeout=60)
            body = problem(r, 504, "durability-ambiguous")
            assert body["partition"] == p and body["node"] == "n1" and body["seqno"] > seqno
            assert body["applied"] == "unknown" and body["durability"] == "majority"
            assert f"partition {p}" in body["detail"] and "may have been applied" in body["detail"]
            ambiguous = body["seqno"]
            r = httpx.post(f"{n1.url}/docs/_bulk", params={"durability": "persist_majority",
                                                            "durability_timeout_ms": 300},
                           json=[{"op": "set", "key": key, "value": 5}], timeout=60)
            assert problem(r, 504, "durability-ambiguous")["durability"] == "persist_majority"
            got = httpx.get(f"{n1.url}/docs/{key}", timeout=10)  # applied on the active all the same
            assert got.status_code == 200 and got.content == b"5"
        finally:
            n2.proc.send_signal(signal.SIGCONT)
        until(lambda: replica_of_p()["received_seqno"] > ambiguous, what="the replica acknowledging again")
        w = httpx.put(f"{n1.url}/docs/{key}", params={"durability": "majority"}, content=b"six", timeout=60)
        assert w.status_code == 200, w.text
        capsys.readouterr()
        assert cli.main(["put", key, "seven", "--durability", "persist_majority", "--server", n1.url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["durability"] == "persist_majority"
    finally:
        cluster.stop_all()
