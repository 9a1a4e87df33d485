"""Crash tests with real processes: a writer is SIGKILLed mid-load, then the store reopens."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.core.errors import KeyNotFound
from engine.core.types import FailoverEntry, Op, WriteOp

WRITER = Path(__file__).with_name("crash_writer.py")
ROOT = Path(__file__).resolve().parents[2]


def start_writer(data_dir: Path, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(WRITER), str(data_dir), mode], stdout=subprocess.PIPE,
                            text=True, env=env)


def check_store_consistent(engine: Engine) -> None:
    """Each partition's by-seqno scan holds each key once, matching by-key reads and counters."""
    for p in range(engine.num_partitions):
        stats = engine.stats(p)
        items = list(engine.snapshot(p, 0).items())
        assert len({i.key for i in items}) == len(items)
        assert [i.seqno for i in items] == sorted(i.seqno for i in items)
        assert all(i.seqno <= stats.persisted_seqno for i in items)
        live = [i for i in items if not i.deleted]
        assert len(live) == stats.item_count
        for item in items:
            if item.deleted:
                with pytest.raises(KeyNotFound):
                    engine.get(item.key.decode())
            else:
                doc = engine.get(item.key.decode())
                assert (doc.seqno, doc.cas, doc.rev, doc.value) == (item.seqno, item.cas, item.rev, item.value)


@pytest.mark.slow
def test_sigkill_mid_load_loses_no_persisted_write(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc = start_writer(data_dir, "load")
    acked: list[dict] = []
    start = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            msg = json.loads(line)
            if msg["type"] == "start":
                start = msg
            else:
                acked.append(msg)
            if len(acked) >= 1500:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert start is not None and len(acked) >= 1500

    engine = Engine.open(EngineConfig(data_dir=data_dir, partitions=99))
    try:
        assert not engine.opened_clean and engine.num_partitions == 8
        for a in acked:
            doc = engine.get(a["key"])
            assert (doc.partition, doc.seqno, doc.value) == (a["partition"], a["seqno"], a["value"].encode())
        for p in range(8):
            old = tuple(FailoverEntry(u, s) for u, s in start["logs"][str(p)])
            log = engine.failover_log(p)
            stats = engine.stats(p)
            assert log[1:] == old, "exactly one new entry"
            assert log[0].seqno == stats.persisted_seqno == stats.high_seqno
            assert log[0].uuid not in (0, *(e.uuid for e in old))
            assert stats.persisted_seqno >= max(a["seqno"] for a in acked if a["partition"] == p)
        check_store_consistent(engine)
        key = next(f"new-{i}" for i in range(1000) if engine.partition_of(f"new-{i}") == 3)
        high = engine.high_seqno(3)
        assert engine.write(WriteOp(Op.MUTATION, key, b"after")).seqno == high + 1
    finally:
        engine.close()
    # a clean restart after the unclean one adds nothing more
    again = Engine.open(EngineConfig(data_dir=data_dir))
    try:
        assert again.opened_clean
        assert [len(again.failover_log(p)) for p in range(8)] == [len(start["logs"][str(p)]) + 1] * 8
    finally:
        again.close()


@pytest.mark.slow
def test_unclean_restart_prunes_the_unpersisted_branch(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc = start_writer(data_dir, "branch")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    lines = [json.loads(line) for line in out.splitlines()]
    created = lines[0]["logs"]["0"]
    before_crash = lines[1]["log"]
    assert [s for _u, s in before_crash] == [15, 0]
    engine = Engine.open(EngineConfig(data_dir=data_dir))
    try:
        log = engine.failover_log(0)
        assert [e.seqno for e in log] == [10, 0]
        assert (log[1].uuid, log[1].seqno) == tuple(created[0])
        assert log[0].uuid not in (before_crash[0][0], created[0][0])
        assert engine.high_seqno(0) == engine.persisted_seqno(0) == 10
        with pytest.raises(KeyNotFound):
            engine.get("q-0")
        check_store_consistent(engine)
        assert engine.write(WriteOp(Op.MUTATION, "q-0", b"z")).seqno == 11
    finally:
        engine.close()
