"""A cluster partition with no live active node holds itself, never the query: planning leaves it
where it is, reports it and tries again at the next trigger, while every other partition flows
(what ``clients.Consumer`` does with an ``Unserved`` partition).

The metadata fetch runs against small HTTP servers (the standard library's) that answer
``GET /cluster`` and ``GET /partitions`` as nodes do, one of them named by the map but gone."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.protocol.client.routing import MapView
from spark_connector.cluster_map import NoActiveNode, split_routes
from spark_connector.meta import fetch_routed
from spark_connector.offsets import PartitionOffset
from spark_connector.options import OnRollback, Position, parse_options
from spark_connector.progress import (
    ServerMeta,
    ServerPartition,
    initial_offset,
    next_offset,
    resolve_positions,
    select_partitions,
)
from spark_connector.retry import SourceUnavailable



def test_split_routes_names_every_partition_without_a_live_active() -> None:
    view = MapView(4, {0: "n1", 1: None, 2: "n2", 3: "n1"}, {"n1": "http://a", "n2": None})
    routes, unserved = split_routes(view, [0, 1, 2, 3, 9])
    assert routes == {0: "http://a", 3: "http://a"}
    assert unserved == {1: "partition 1 has no active node in map revision 4",
                        2: "partition 2 has its active node n2 is down in map revision 4",
                        9: "partition 9 is not in the cluster map (revision 4, 4 partitions)"}


META = ServerMeta(3, {0: ServerPartition(0, 100, 0, ((9, 0),)), 2: ServerPartition(2, 30, 0, ((7, 0),))},
                  {1: "partition 1 has no active node in map revision 4"})


def test_planning_moves_the_served_partitions_and_holds_the_unserved_one() -> None:
    assert select_partitions(META, None) == [0, 1, 2]            # still the query's partitions
    start = initial_offset(Position.EARLIEST, META, [0, 1, 2])
    end = next_offset(start, META, check=lambda pos, sp: None, policy=OnRollback.FAIL)
    assert {p: o.seqno for p, o in end.partitions.items()} == {0: 100, 1: 0, 2: 30}
    assert end.partitions[1] == start.partitions[1] and end.num_partitions == 3
    # later: partition 1 is back (its new active's history), the others have nothing new
    back = ServerMeta(3, {**META.partitions, 1: ServerPartition(1, 55, 0, ((5, 0),))})
    later = next_offset(end, back, check=lambda pos, sp: None, policy=OnRollback.FAIL)
    assert {p: o.seqno for p, o in later.partitions.items()} == {0: 100, 1: 55, 2: 30}
    # nothing served moved and the unserved one cannot: start == end, so Spark plans no batch
    idle = next_offset(end, META, check=lambda pos, sp: None, policy=OnRollback.FAIL)
    assert idle == end


def test_latest_needs_the_unserved_partitions_high_seqno() -> None:
    with pytest.raises(NoActiveNode, match="partition 1 has no active node"):
        resolve_positions(Position.LATEST, META, [0, 1, 2])
    assert resolve_positions(Position.LATEST, META, [0, 2]).partitions[2] == PartitionOffset(7, 30, 30, 30)


# ------------------------------------------------------------------ metadata from "nodes"

def _serve(routes: dict[str, object]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = routes.get(self.path)
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def nodes() -> Iterator[tuple[str, str, dict]]:
    """Node n1 (serving partitions 0 and 2) and a map naming n1, n2 (gone: nothing listens at its
    URL) and no active at all for partition 3."""
    routes: dict[str, object] = {}
    gen = _serve(routes)
    n1 = next(gen)
    gone = "http://127.0.0.1:9"          # discard port: refused
    routes["/cluster"] = {
        "nodes": [{"name": "n1", "state": "up", "url": n1}, {"name": "n2", "state": "up", "url": gone}],
        "map": {"revision": 6, "partitions": [{"partition": 0, "active": "n1"}, {"partition": 1, "active": "n2"},
                                              {"partition": 2, "active": "n1"}, {"partition": 3, "active": None}]}}
    part = lambda p, high: {"partition": p, "high_seqno": high, "purge_seqno": 0, "state": "active",  # noqa: E731
                            "failover_log": [{"uuid": 11 + p, "seqno": 0}]}
    routes["/partitions"] = {"partitions": [part(0, 40), part(2, 70)]}
    yield n1, gone, routes
    next(gen, None)


def test_a_trigger_reads_the_served_partitions_and_reports_the_others(nodes) -> None:
    n1, gone, _ = nodes
    opts = parse_options({"server": f"{gone},{n1}", "fetchOffset.numRetries": "0"})
    meta, routes = fetch_routed(opts, partial=True)
    assert meta.num_partitions == 4 and sorted(meta.partitions) == [0, 2] and routes == {0: n1, 2: n1}
    assert sorted(meta.unavailable) == [1, 3]
    assert "cannot be read" in meta.unavailable[1] and gone.removeprefix("http://") in meta.unavailable[1]
    assert "no active node" in meta.unavailable[3]
    # a batch read (exact ranges of every partition) still waits for all of them, then says why
    with pytest.raises(SourceUnavailable, match=r"partition 1: its active node .* cannot be read .*and 1 more"):
        fetch_routed(opts)


def test_no_partition_served_at_all_is_retried_then_one_clear_error(nodes) -> None:
    n1, _, routes = nodes
    routes["/partitions"] = {"partitions": []}              # n1 holds nothing active (yet)
    opts = parse_options({"server": n1, "fetchOffset.numRetries": "1", "fetchOffset.retryIntervalMs": "10"})
    with pytest.raises(SourceUnavailable, match=r"gave up after 2 attempts"):
        fetch_routed(opts, partial=True)


def test_a_partition_the_plan_held_is_reported_unserved_even_once_the_map_moved_it(nodes) -> None:
    """Trigger.AvailableNow ends on the plan: a partition it held must be reported as unserved by
    that plan even if its new active is up by the time the progress is reported, or an index run
    would take itself for up to date and stop short of it."""
    from spark_connector.source import UprStreamReader

    n1, _, routes = nodes
    reader = UprStreamReader({"server": n1, "fetchOffset.numRetries": "0"})
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    assert {p: o["s"] for p, o in end["p"].items()} == {"0": 40, "1": 0, "2": 70, "3": 0}
    # the failover completes between the plan and the report: n1 is active for everything now
    routes["/cluster"]["map"]["partitions"] = [{"partition": p, "active": "n1"} for p in range(4)]
    routes["/partitions"] = {"partitions": [*routes["/partitions"]["partitions"],
                                            {"partition": 1, "high_seqno": 9, "purge_seqno": 0, "state": "active",
                                             "failover_log": [{"uuid": 5, "seqno": 0}]},
                                            {"partition": 3, "high_seqno": 0, "purge_seqno": 0, "state": "active",
                                             "failover_log": [{"uuid": 6, "seqno": 0}]}]}
    assert sorted(reader.reportLatestOffset()["unavailablePartitions"]) == ["1", "3"]
    # the next plan serves them, and then nothing is reported
    reader.latestOffset(end, None)
    assert "unavailablePartitions" not in reader.reportLatestOffset()


@pytest.mark.parametrize("first_run_s,runs_seen", [
    (0.5, 3),    # quick runs: again after each, until the partitions are served
    (45.0, 3),   # a first run longer than the whole wait is still followed by the others
])
def test_an_index_run_runs_again_while_partitions_are_unserved(tmp_path, first_run_s: float, runs_seen: int) -> None:
    """``IndexJob.run`` counts its wait for unserved partitions from the first run that ended
    with some, not from its own start."""
    from spark_connector.index.functions import FieldIndex
    from spark_connector.index.job import IndexJob, RunReport

    now = [0.0]
    scripted = [({1: "n1 is down"}, first_run_s), ({1: "n1 is down"}, 2.0), ({}, 2.0), ({}, 2.0)]
    runs: list[int] = []

    class Scripted(IndexJob):
        _clock = staticmethod(lambda: now[0])
        _sleep = staticmethod(lambda s: now.__setitem__(0, now[0] + s))

        def _run_once(self, *args, **kwargs) -> RunReport:  # type: ignore[no-untyped-def]
            unavailable, seconds = scripted[len(runs)]
            runs.append(1)
            now[0] += seconds
            return RunReport(batches=1, unavailable=dict(unavailable), seconds=seconds)

    report = Scripted(None, tmp_path / "index", "http://127.0.0.1:9", FieldIndex("city")).run(unavailable_wait_s=30)
    assert len(runs) == runs_seen and report.unavailable == {} and report.batches == runs_seen


def test_an_index_run_gives_up_waiting_and_names_what_is_unserved(tmp_path) -> None:
    from spark_connector.index.functions import FieldIndex
    from spark_connector.index.job import IndexJob, RunReport

    now = [0.0]

    class NeverServed(IndexJob):
        _clock = staticmethod(lambda: now[0])
        _sleep = staticmethod(lambda s: now.__setitem__(0, now[0] + s))

        def _run_once(self, *args, **kwargs) -> RunReport:  # type: ignore[no-untyped-def]
            now[0] += 4.0
            return RunReport(batches=1, unavailable={3: "partition 3 has no active node"}, seconds=4.0)

    report = NeverServed(None, tmp_path / "index", "http://127.0.0.1:9", FieldIndex("city")).run(unavailable_wait_s=10)
    assert report.unavailable == {3: "partition 3 has no active node"} and report.batches == 3
