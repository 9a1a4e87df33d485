"""The mirror consumer ends identical to the server through every kind of crash.

A separate process applies the feed to SQLite; the test writes and deletes at random, SIGKILLs
the consumer at random points, SIGKILLs the server with unpersisted mutations that the consumer
already applied (repaired through the ring buffer with corrections), and finally makes a rollback
deeper than the ring (the partition is reset and streamed again from 0).
"""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from clients.ring import FILE_NAME, RollbackRing
from clients.state import FileStateStore
from tests.support.docs import bulk as post_bulk
from tests.support.net import free_port
from tests.support.server import ROOT, start_server

pytestmark = pytest.mark.slow

PARTITIONS = 4
KEYS = [f"key-{i}" for i in range(160)]


class MirrorProc:
    def __init__(self, url: str, workdir: Path, ring_size: int) -> None:
        self.url, self.workdir, self.ring_size = url, workdir, ring_size
        self.state_dir = workdir / "state"
        self.db_path = workdir / "mirror.db"
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def start(self, ring_size: int | None = None) -> None:
        if ring_size is not None:
            self.ring_size = ring_size
        env = {k: v for k, v in os.environ.items() if not k.startswith("UPR_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.client.mirror_proc", self.url, str(self.state_dir), str(self.db_path),
             str(self.ring_size)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        proc = self.proc

        def read() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                self.lines.append(line.strip())

        threading.Thread(target=read, daemon=True).start()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        # the state file is always whole, and the ring within its size
        store = FileStateStore(self.state_dir)
        store.load()
        store.close()
        ring = RollbackRing(self.ring_size, self.state_dir)
        assert len(ring) <= self.ring_size
        ring.close()

    def docs(self) -> dict[str, bytes]:
        db = sqlite3.connect(self.db_path)
        try:
            return {k: bytes(v) for k, v in db.execute("select key, value from docs")}
        except sqlite3.OperationalError:
            return {}
        finally:
            db.close()


def server_docs(url: str) -> dict[str, bytes]:
    out = {}
    with httpx.Client(base_url=url, timeout=10) as c:
        for k in KEYS:
            r = c.get(f"/docs/{k}")
            if r.status_code == 200:
                out[k] = r.content
    return out


def converge(mirror: MirrorProc, url: str, timeout: float = 40.0) -> dict[str, bytes]:
    deadline = time.monotonic() + timeout
    want = server_docs(url)
    while time.monotonic() < deadline:
        got = mirror.docs()
        if got == want:
            return want
        time.sleep(0.2)
        want = server_docs(url)
    got = mirror.docs()
    missing = sorted(set(want) - set(got))[:5]
    extra = sorted(set(got) - set(want))[:5]
    stale = sorted(k for k in set(want) & set(got) if want[k] != got[k])[:5]
    raise AssertionError(f"mirror differs: missing {missing}, extra {extra}, stale {stale}; log {mirror.lines[-10:]}")


def random_ops(rng: random.Random, n: int, tag: str) -> list[dict]:
    ops = []
    for i in range(n):
        key = rng.choice(KEYS)
        if rng.random() < 0.25:
            ops.append({"op": "delete", "key": key})
        else:
            ops.append({"op": "set", "key": key, "value_b64": None, "value": f"{tag}-{i}-{rng.random()}"})
    for op in ops:
        op.pop("value_b64", None)
    return ops


def bulk(url: str, ops: list[dict], durability: str = "memory") -> None:
    post_bulk(url, ops, durability, ok_statuses=(200, 404))  # deleting an absent key is a 404 item


def test_mirror_ends_identical_through_consumer_and_server_crashes(tmp_path: Path) -> None:
    rng = random.Random(20261121)
    port = free_port()
    args = ["--port", str(port), "--flush-interval-ms", "60000"]
    srv = start_server(tmp_path / "srv", partitions=PARTITIONS, args=args)
    mirror = MirrorProc(srv.url, tmp_path, ring_size=100_000)
    try:
        # 1. random writes and deletes while the consumer is SIGKILLed and restarted at random points
        mirror.start()
        for round_ in range(6):
            for chunk in range(rng.randint(2, 5)):
                bulk(srv.url, random_ops(rng, rng.randint(20, 120), f"r{round_}c{chunk}"), durability="persist")
                time.sleep(rng.uniform(0, 0.05))
            time.sleep(rng.uniform(0.0, 0.3))
            mirror.kill()
            mirror.start()
        converge(mirror, srv.url)

        # 2. the server dies with mutations the consumer already applied but the server never persisted
        bulk(srv.url, random_ops(rng, 150, "volatile"), durability="memory")
        converge(mirror, srv.url)
        before = len(mirror.lines)
        srv.kill()
        srv = start_server(tmp_path / "srv", data_dir=srv.data_dir, partitions=PARTITIONS, args=args)
        converge(mirror, srv.url)
        rollbacks = [x for x in mirror.lines[before:] if x.startswith("rollback") and x.endswith("diverged")]
        assert rollbacks, mirror.lines
        assert sum(int(x.split()[3]) for x in rollbacks) > 0  # corrections were delivered
        bulk(srv.url, random_ops(rng, 100, "after-restart"), durability="persist")
        converge(mirror, srv.url)

        # 3. a rollback deeper than the ring: the partition is reset and streamed again from 0
        mirror.kill()
        mirror.start(ring_size=10)
        converge(mirror, srv.url)
        bulk(srv.url, [{"op": "set", "key": k, "value": f"deep-{k}"} for k in KEYS[:60]], durability="memory")
        converge(mirror, srv.url)
        before = len(mirror.lines)
        srv.kill()
        srv = start_server(tmp_path / "srv", data_dir=srv.data_dir, partitions=PARTITIONS, args=args)
        final = converge(mirror, srv.url)
        resets = [x for x in mirror.lines[before:] if x.startswith("reset")]
        assert resets, mirror.lines[before:]
        assert len(final) > 0
        ring_file = mirror.state_dir / FILE_NAME
        assert ring_file.stat().st_size < 64 * 1024  # a 10-entry ring stays small on disk
    finally:
        if mirror.proc is not None and mirror.proc.poll() is None:
            mirror.proc.kill()
            mirror.proc.wait()
        srv.kill()
