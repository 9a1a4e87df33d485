"""A restore whose server crashes and comes back between two batches of a partition.

The server keeps ``memory`` writes unpersisted for a minute (``--flush-interval-ms 60000``), so
the batches it acknowledged before the SIGKILL are surely gone when it restarts on the same port;
the restart is done before the restore's next request, which therefore never fails: only the
partition's new history branch (its failover log) tells.  The partition must be written again
from its first batch, and the server must equal the archive afterwards."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clients.backup.archive import Archive
from clients.backup.create import create_backup
from tests.support.net import free_port

from .live import bulk, del_op, read_state, set_op

restore_module = importlib.import_module("clients.backup.restore")  # the package exports a function of that name


def test_a_crash_restart_between_batches_rewrites_the_partition(upr_server: Callable, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    data = tmp_path / "data"
    args = ["--flush-interval-ms", "60000", "--port", str(port)]
    servers = [upr_server(partitions=2, data_dir=data, args=args)]
    url = servers[0].url
    keys = [f"k{i}" for i in range(600)]
    bulk(url, [set_op(k, f"value-{k}".encode() * 20) for k in keys], durability="persist")
    create_backup(tmp_path / "archive", url, idle_timeout=30)
    want = read_state(url, keys)
    bulk(url, [del_op(k) for k in keys], durability="persist")

    real_write = restore_module._write
    memory_acks: list[int] = []

    def write_then_crash(client: Any, p: int, batch: list[Any], durability: str) -> Any:
        ack = real_write(client, p, batch, durability)
        if p == 0 and durability == "memory":
            memory_acks.append(len(batch))
            if len(memory_acks) == 2 and len(servers) == 1:  # two acknowledged batches, unpersisted
                servers[0].kill()
                servers.append(upr_server(partitions=2, data_dir=data, args=args))
        return ack

    monkeypatch.setattr(restore_module, "_write", write_then_crash)
    report = restore_module.restore(Archive.open(tmp_path / "archive"), url, batch_items=50, parallel=1)
    assert len(servers) == 2 and servers[1].url == url, "the crash did not happen during the restore"
    assert 0 in report.rewritten, report
    assert read_state(url, keys) == want
