"""The CLI's HTTP commands and ``HttpApi`` against a real server process.

The commands run in-process through the entry point ``upr`` runs (``app.cli.main``: its exit
code, its stdout and stderr), against the real server; a few run as real ``upr`` processes too,
for what only a process shows (stdin from a pipe, the exit code ``sys.exit`` passes on).  A ``upr``
process costs 0.7-1 s of CPU in imports alone."""
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from app import cli
from clients.errors import AuthFailed, ConnectionFailed, HttpError
from clients.http import HttpApi
from tests.support.server import ROOT

pytestmark = pytest.mark.slow


def upr_process(*args: str, env: dict[str, str] | None = None,
                stdin: bytes | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("UPR_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=full_env, input=stdin,
                          capture_output=True, timeout=60)


@pytest.fixture
def upr(capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch) -> Callable[..., subprocess.CompletedProcess]:
    """``upr ARGS`` in this process: what ``upr_process`` gives, without a new interpreter."""
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        with monkeypatch.context() as m:
            for name in [k for k in os.environ if k.startswith("UPR_")]:
                m.delenv(name)
            for name, value in (env or {}).items():
                m.setenv(name, value)
            m.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
            capsysbinary.readouterr()
            try:
                code = cli.main(list(args))
            except SystemExit as exc:                   # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
            out, err = capsysbinary.readouterr()
        return subprocess.CompletedProcess(["upr", *args], code, out, err)
    return run


def test_http_api_and_cli_roundtrip(upr_server, upr):
    srv = upr_server(partitions=4, tokens={"adm-token-1": "admin", "read-token-1": "read"})
    with HttpApi(srv.url, "adm-token-1") as api:
        res = api.put("a/b c", b"\xff\x00bin", durability="persist")
        doc = api.get("a/b c")
        assert doc is not None and doc.value == b"\xff\x00bin" and doc.seqno == res["seqno"]
        assert doc.partition == res["partition"] and doc.cas == res["cas"]
        assert api.get("missing") is None
        with pytest.raises(HttpError) as info:
            api.put("a/b c", b"x", cas=res["cas"] + 1)
        assert info.value.status == 412
        assert len(api.partitions()) == 4
        assert api.partition(res["partition"])["failover_log"]
        assert api.status()["partitions"] == 4
    with HttpApi(srv.url, "read-token-1") as api, pytest.raises(AuthFailed):
        api.put("k", b"v")
    with HttpApi(srv.url, "nope-token-1") as api, pytest.raises(AuthFailed):
        api.get("k")

    env = {"UPR_SERVER": srv.url, "UPR_TOKEN": "adm-token-1"}
    r = upr("put", "k1", "hello", env=env)
    assert r.returncode == 0 and b"stored 'k1'" in r.stdout
    r = upr_process("put", "k2", "-", "--json", env=env, stdin=b"from stdin")
    assert r.returncode == 0 and json.loads(r.stdout)["key"] == "k2"
    assert upr("get", "k2", "--raw", env=env).stdout == b"from stdin"
    assert upr("get", "k2", env=env).stdout == b"from stdin\n"  # a line, like redis-cli and etcdctl print
    got = json.loads(upr("get", "a/b c", "--json", env=env).stdout)
    assert got["value_b64"] == "/wBiaW4=" and "value" not in got
    r = upr("delete", "k1", env=env)
    assert r.returncode == 0
    r = upr("get", "k1", env=env)
    assert r.returncode == 1 and r.stderr.strip() == b"upr: error: key 'k1' not found"
    assert len(json.loads(upr("partitions", "--json", env=env).stdout)) == 4
    assert upr("partitions", env=env).stdout.count(b"\n") == 5
    log = json.loads(upr("failover-log", "0", "--json", env=env).stdout)
    assert log and {"uuid", "seqno"} <= set(log[0])
    assert b"4 partitions" in upr("status", env=env).stdout
    # errors: one line on stderr, distinct exit codes
    r = upr_process("status", "--server", srv.url, "--token", "bad")
    assert r.returncode == 4 and r.stderr.count(b"\n") == 1 and b"401" in r.stderr
    r = upr("put", "k", "v", "--server", srv.url, "--token", "read-token-1")
    assert r.returncode == 4 and b"403" in r.stderr
    r = upr("failover-log", "99", env=env)
    assert r.returncode == 1 and r.stderr.startswith(b"upr: error:")
    r = upr("status", "--server", "http://127.0.0.1:1")
    assert r.returncode == 3 and r.stderr.count(b"\n") == 1
    r = upr("failover-log", "x", env=env)
    assert r.returncode == 2

    # streaming commands
    r = upr("barrier", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)["seqnos"]) == {"0", "1", "2", "3"}
    assert upr("barrier", env=env).stdout.startswith(b"barrier reached: 4 partition(s)")
    p = res["partition"]
    r = upr("tail", "--until", "now", "--partitions", str(p), env=env)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 0 and lines and {x["partition"] for x in lines} == {p}
    assert upr("tail", "--until", "now", "--from", "now", env=env).stdout == b""
    r = upr("tail", "--until", "now", "--server", srv.url, "--token", "bad-token-1")
    assert r.returncode == 4 and r.stderr.count(b"\n") == 1 and b"401" in r.stderr
    r = upr("tail", "--until", "now", "--server", "http://127.0.0.1:1")
    assert r.returncode == 3 and r.stderr.count(b"\n") == 1
    r = upr("tail", "--partitions", "99", "--until", "now", env=env)
    assert r.returncode == 2 and b"out of range" in r.stderr


def test_unreachable_raises_typed_error():
    with HttpApi("http://127.0.0.1:1") as api, pytest.raises(ConnectionFailed):
        api.status()
