"""A node that cannot join its cluster says why in one line, exits 2 and writes nothing: another
partition count, a live node's name, flags that make no node, an etcd nobody answers at."""
from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster
from tests.support.net import free_port
from tests.support.server import ROOT, server_command, server_env


def start(tmp_path: Path, args: list[str], partitions: int = 16) -> tuple[int, str, Path]:
    data = tmp_path / f"data-{uuid.uuid4().hex[:6]}"
    cmd = server_command(data, tmp_path / "ready", partitions=partitions, extra=args)
    proc = subprocess.run(cmd, cwd=ROOT, env=server_env(), capture_output=True, timeout=60)
    return proc.returncode, proc.stderr.decode(), data


@pytest.mark.slow
def test_refusals_are_one_line_and_write_nothing(tmp_path: Path, etcd: EtcdProcess) -> None:
    cluster = Cluster(tmp_path, etcd.url, partitions=16, replicas=1, initial_nodes=1,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        cluster.start("n1")
        cases = [
            (cluster.args("n2", free_port()), 8, "has 16 partitions and 1 replicas; this node was started with 8 and 1"),
            (cluster.args("n1", free_port()), 16, "node name 'n1' is already used by a live node at"),
            (["--cluster", "etcd://127.0.0.1:1", "--node", "x", "--advertise", "http://127.0.0.1:9"], 16,
             "cannot join the cluster at etcd://127.0.0.1:1: no etcd endpoint answered"),
            (["--cluster", "http://127.0.0.1:1", "--node", "x"], 16, "--cluster must look like etcd://HOST:PORT"),
            (["--cluster", "etcd://127.0.0.1:1"], 16, "--cluster needs --node NAME"),
            (["--cluster", "etcd://127.0.0.1:1", "--node", "x"], 16, "--cluster with --port 0 needs --advertise URL"),
        ]
        for args, partitions, expected in cases:
            code, stderr, data = start(tmp_path, args, partitions)
            assert code == 2, (args, code, stderr)
            assert stderr.count("\n") == 1 and expected in stderr, (args, stderr)
            assert not data.exists()
    finally:
        cluster.stop_all()
