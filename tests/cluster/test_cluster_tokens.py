"""A cluster whose nodes check bearer tokens: replicas authenticate with the node's
``UPR_CLUSTER_TOKEN`` (admin role) and keep in sync; a caller with a lesser role cannot open a
replication connection, whose acks would count toward majority durability."""
from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx

from clients.connection import StreamConnection, stream_url
from engine.protocol import messages as M
from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster, partition_of, placed, replicas_caught_up, until

TOKENS = {"node-secret": "admin", "reader-token": "read"}


def test_replicas_authenticate_and_a_reader_cannot_replicate(tmp_path: Path, etcd: EtcdProcess) -> None:
    cluster = Cluster(tmp_path, etcd.url, partitions=8, replicas=1, initial_nodes=2,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}", tokens=TOKENS, env={"UPR_CLUSTER_TOKEN": "node-secret"})
    try:
        cluster.start_all(("n1", "n2"))
        view = until(lambda: (v := cluster.view("n1")) and placed(v) and v, what="the first map")
        urls = {n["name"]: n["url"] for n in view["nodes"]}
        admin = {"Authorization": "Bearer node-secret"}
        for i in range(40):
            key = f"doc-{i}"
            active = view["map"]["partitions"][partition_of(key, 8)]["active"]

            def put(key: str = key, active: str = active) -> bool:
                return httpx.put(f"{urls[active]}/docs/{key}", content=b"v", headers=admin,
                                 timeout=30).status_code == 200

            until(put, what=f"the write of {key}")
        until(lambda: replicas_caught_up(cluster), what="every replica in sync through authenticated streams")
        assert httpx.get(f"{urls['n1']}/cluster", timeout=10).status_code == 401

        async def replicate_as_reader() -> object:
            conn = await StreamConnection.open(stream_url(urls["n1"]), "reader-token", open_timeout=10,
                                               max_frame_bytes=1 << 20, ping_interval=None)
            try:
                await conn.send(M.Hello("replication:intruder", codec=M.Codec.BINARY))
                answer, _ = await conn.first(10)
                return answer
            finally:
                await conn.close()

        answer = asyncio.run(replicate_as_reader())
        assert isinstance(answer, M.Error) and answer.code == "replication_forbidden", answer
    finally:
        cluster.stop_all()
