"""``upr tail`` end to end: JSON lines, --until now over 1e5 mutations, state dirs, rollback corrections."""
from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys

import httpx
import pytest

from tests.support.docs import bulk
from tests.support.server import ROOT

pytestmark = pytest.mark.slow


def upr(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPR_")}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          timeout=timeout)


def apply_lines(stdout: bytes, docs: dict | None = None) -> dict[str, tuple[bytes, int, int]]:
    """Apply ``upr tail`` lines in order: key -> (value, cas, partition)."""
    docs = {} if docs is None else docs
    for line in stdout.splitlines():
        obj = json.loads(line)
        if obj["op"] == "reset":
            docs = {k: v for k, v in docs.items() if v[2] != obj["partition"]}
            continue
        assert {"partition", "seqno", "key", "op", "cas"} <= set(obj)
        if obj["op"] == "mutation":
            value = obj["value"].encode() if "value" in obj else base64.b64decode(obj["value_b64"])
            docs[obj["key"]] = (value, obj["cas"], obj["partition"])
        else:
            assert obj["op"] == "deletion" and "value" not in obj
            docs.pop(obj["key"], None)
    return docs


def test_tail_until_now_over_1e5_mutations_prints_exactly_the_live_keys(upr_server):
    srv = upr_server(partitions=8)
    rng = random.Random(5)
    model: dict[str, tuple[bytes, int]] = {}
    written = 0
    while written < 100_000:
        ops = []
        for _ in range(10_000):
            k = f"doc-{rng.randrange(40_000)}"
            if rng.random() < 0.1:
                ops.append({"op": "delete", "key": k})
            elif rng.random() < 0.05:
                ops.append({"op": "set", "key": k, "value_b64": base64.b64encode(os.urandom(12)).decode()})
            else:
                ops.append({"op": "set", "key": k, "value": {"n": written, "k": k}})
        for op, res in zip(ops, bulk(srv.url, ops)):
            if res["status"] != 200:
                assert op["op"] == "delete" and res["status"] == 404
                continue
            written += 1
            if op["op"] == "delete":
                model.pop(op["key"], None)
            else:
                value = base64.b64decode(op["value_b64"]) if "value_b64" in op else \
                    json.dumps(op["value"], separators=(",", ":")).encode()
                model[op["key"]] = (value, res["cas"])
    r = upr("tail", "--server", srv.url, "--until", "now")
    assert r.returncode == 0, r.stderr
    got = apply_lines(r.stdout)
    assert got.keys() == model.keys()
    assert {k: v[1] for k, v in got.items()} == {k: v[1] for k, v in model.items()}  # latest versions
    assert {k: v[0] for k, v in got.items() if v[0][:1] == b"{"} == \
        {k: v[0] for k, v in model.items() if v[0][:1] == b"{"}
    binary = [line for line in r.stdout.splitlines() if b'"value_b64"' in line]
    assert binary  # non-UTF-8 values travel as base64


def test_tail_state_dir_prints_only_changes_and_corrections_after_a_rollback(tmp_path):
    from tests.support.net import free_port
    from tests.support.server import start_server

    port = free_port()
    args = ["--port", str(port), "--flush-interval-ms", "60000"]
    srv = start_server(tmp_path / "srv", partitions=4, args=args)
    try:
        state = f"state:{tmp_path / 'st'}"
        bulk(srv.url, [{"op": "set", "key": f"a{i}", "value": f"one-{i}"} for i in range(50)], "persist")
        first = upr("tail", "--server", srv.url, "--from", state, "--until", "now")
        assert first.returncode == 0, first.stderr
        docs = apply_lines(first.stdout)
        assert len(docs) == 50
        again = upr("tail", "--server", srv.url, "--from", state, "--until", "now")
        assert again.stdout == b""  # nothing changed since the last run
        bulk(srv.url, [{"op": "set", "key": f"a{i}", "value": f"two-{i}"} for i in range(10)] +
             [{"op": "delete", "key": "a49"}], "persist")
        bulk(srv.url, [{"op": "set", "key": f"a{i}", "value": "lost"} for i in range(10, 20)] +
             [{"op": "set", "key": "brand-new", "value": "lost"}])  # memory only: lost in the crash
        second = upr("tail", "--server", srv.url, "--from", state, "--until", "now")
        assert len(second.stdout.splitlines()) == 22
        docs = apply_lines(second.stdout, docs)
        assert docs["a10"][0] == b'"lost"'
        srv.kill()
        srv = start_server(tmp_path / "srv", data_dir=srv.data_dir, partitions=4, args=args)
        third = upr("tail", "--server", srv.url, "--from", state, "--until", "now")
        assert third.returncode == 0, third.stderr
        assert b"rollback" in third.stderr
        docs = apply_lines(third.stdout, docs)
        with httpx.Client(base_url=srv.url) as c:
            truth = {}
            for k in [f"a{i}" for i in range(50)] + ["brand-new"]:
                resp = c.get(f"/docs/{k}")
                if resp.status_code == 200:
                    truth[k] = resp.content
        assert {k: v[0] for k, v in docs.items()} == truth
        assert "brand-new" not in truth and docs["a10"][0] == b'"one-10"'
    finally:
        srv.kill()


def test_tail_rollback_deeper_than_the_ring_prints_a_reset_then_the_partition_again(tmp_path):
    from tests.support.net import free_port
    from tests.support.server import start_server

    args = ["--port", str(free_port()), "--flush-interval-ms", "60000"]
    srv = start_server(tmp_path / "srv", partitions=2, args=args)
    try:
        state = f"state:{tmp_path / 'st'}"
        bulk(srv.url, [{"op": "set", "key": f"k{i}", "value": f"kept-{i}"} for i in range(20)], "persist")
        bulk(srv.url, [{"op": "delete", "key": "k0"}, {"op": "delete", "key": "k1"}], "persist")
        bulk(srv.url, [{"op": "set", "key": f"k{i}", "value": "lost"} for i in range(2, 20)])  # memory only
        out = upr("tail", "--server", srv.url, "--from", state, "--until", "now", "--ring-size", "3")
        docs = apply_lines(out.stdout)
        srv.kill()
        srv = start_server(tmp_path / "srv", data_dir=srv.data_dir, partitions=2, args=args)
        again = upr("tail", "--server", srv.url, "--from", state, "--until", "now", "--ring-size", "3")
        assert again.returncode == 0, again.stderr
        resets = [json.loads(x) for x in again.stdout.splitlines() if b'"reset"' in x]
        assert resets and b"deeper than the ring" in again.stderr
        docs = apply_lines(again.stdout, docs)
        assert {k: v[0] for k, v in docs.items()} == {f"k{i}": b'"kept-%d"' % i for i in range(2, 20)}
    finally:
        srv.kill()
