"""``upr put/get/delete`` in a cluster (real etcd, two real nodes): any node will do.

The document commands follow ``421 misdirected-request`` to the active node the answer names,
accept several ``--server`` URLs and move past one that refuses the connection; a redirect loop
ends after a bounded number of hops with one error line and exit 1."""
from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app import cli
from clients.http import HttpApi
from tests.cluster.etcd_server import EtcdProcess
from tests.cluster.nodes import Cluster, first_map, partition_of
from tests.support.net import free_port

pytestmark = pytest.mark.slow


def test_document_commands_follow_the_map_from_any_node(tmp_path: Path, etcd: EtcdProcess,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    cluster = Cluster(tmp_path, etcd.url, partitions=8, replicas=1, initial_nodes=2,
                      prefix=f"/upr/{uuid.uuid4().hex[:8]}")
    try:
        cluster.start_all(("n1", "n2"))
        view = first_map(cluster, "n1")
        n1, n2 = cluster.nodes["n1"].url, cluster.nodes["n2"].url
        refused = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        actives = {p["partition"]: p["active"] for p in view["map"]["partitions"]}
        keys = {name: next(f"k-{i}" for i in range(1000) if actives[partition_of(f"k-{i}", 8)] == name)
                for name in ("n1", "n2")}
        for owner, key in keys.items():
            other = n2 if owner == "n1" else n1
            # asked of the node that does not own it, past a server that refuses the connection
            assert cli.main(["put", key, f"v-{owner}", "--json", "--server", f"{refused},{other}"]) == 0
            stored = json.loads(capsys.readouterr().out)
            assert stored["partition"] == partition_of(key, 8)
            assert cli.main(["get", key, "--raw", "--server", other]) == 0
            assert capsys.readouterr().out == f"v-{owner}"
            # a read is served where the partition is active, as a write is: the other node's copy
            # (a replica, or none at all) answers 421 naming the active
            misread = httpx.get(f"{other}/docs/{key}", timeout=10)
            assert misread.status_code == 421 and misread.json()["active"] == owner, misread.text
            with HttpApi(cluster.nodes[owner].url) as api:  # it really is on the active
                doc = api.get(key)
                assert doc is not None and doc.value == f"v-{owner}".encode() and doc.seqno == stored["seqno"]
            assert cli.main(["delete", key, "--server", other]) == 0
            assert "deleted" in capsys.readouterr().out
            assert cli.main(["get", key, "--server", other]) == 1
            assert capsys.readouterr().err.strip() == f"upr: error: key {key!r} not found"

        # nothing reachable at all: one line, exit 3
        assert cli.main(["get", "k-0", "--server", f"{refused},{refused}"]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot reach any of" in err
    finally:
        cluster.stop_all()


def _misdirecting(index: int, hits: list[int], targets: list[str]) -> type[http.server.BaseHTTPRequestHandler]:
    """A handler that always answers 421 naming ``targets[index]``: with two, a redirect loop."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            hits[index] += 1
            body = json.dumps({"type": "https://upr.dev/problems/misdirected-request", "status": 421,
                               "title": "Misdirected request", "detail": f"served by {targets[index]}",
                               "url": targets[index], "active": "elsewhere"}).encode()
            self.send_response(421)
            self.send_header("Content-Type", "application/problem+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def redirect_loop() -> Iterator[tuple[str, list[int]]]:
    hits, targets = [0, 0], ["", ""]
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _misdirecting(i, hits, targets)) for i in range(2)]
    urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    targets[:] = [urls[1], urls[0]]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield urls[0], hits
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


def test_a_redirect_loop_ends_after_three_hops(redirect_loop: tuple[str, list[int]],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    url, hits = redirect_loop
    assert cli.main(["put", "k", "v", "--server", url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "after following 3 misdirections" in err and "HTTP 421" in err
    assert sum(hits) == 4  # the first request and three hops
