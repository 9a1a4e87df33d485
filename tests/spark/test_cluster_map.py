"""The source's pure cluster decisions: which node serves a partition, what each failure means,
where a moved work item resumes, and where a batch planned on a lost branch must stop."""
from __future__ import annotations

import pytest

from engine.protocol.client.routing import MapView
from spark_connector.cluster_map import (
    Fault,
    NoActiveNode,
    Progress,
    fault_of_end,
    fault_of_refusal,
    parse_map,
    reachable_end,
    resume_item,
    routes_from_map,
)
from spark_connector.options import OptionError, parse_options
from spark_connector.planning import WorkItem
from spark_connector.retry import Retryable

A, B, C = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"


def view(actives: dict[int, str | None], down: tuple[str, ...] = ()) -> MapView:
    urls = {"n1": A, "n2": B, "n3": C}
    return MapView(7, actives, {n: (None if n in down else u) for n, u in urls.items()})


@pytest.mark.parametrize("actives, down, wanted, expected", [
    ({0: "n1", 1: "n2", 2: "n3"}, (), [0, 1, 2], {0: A, 1: B, 2: C}),
    ({0: "n1", 1: "n1"}, (), [1], {1: A}),
    ({0: "n1", 1: None}, (), [0], {0: A}),                      # only the wanted ones must be served
    ({0: "n1", 1: None}, (), [0, 1], "partition 1 has no active node"),
    ({0: "n1", 1: "n2"}, ("n2",), [0, 1], "partition 1 has its active node n2 is down"),
    ({0: "n1"}, (), [3], "partition 3 is not in the cluster map"),
])
def test_routes_follow_the_map(actives, down, wanted, expected) -> None:
    if isinstance(expected, str):
        with pytest.raises(NoActiveNode, match=expected):
            routes_from_map(view(actives, down), wanted)
    else:
        assert routes_from_map(view(actives, down), wanted) == expected


def test_no_active_node_is_retried_and_a_malformed_map_too() -> None:
    assert issubclass(NoActiveNode, Retryable)
    with pytest.raises(Retryable, match="no usable partition map"):
        parse_map({"nodes": []})
    doc = {"nodes": [{"name": "n1", "state": "up", "url": A + "/"}, {"name": "n2", "state": "down", "url": B}],
           "map": {"revision": 3, "partitions": [{"partition": 0, "active": "n1"}, {"partition": 1, "active": "n2"}]}}
    parsed = parse_map(doc)
    assert routes_from_map(parsed, [0]) == {0: A}
    with pytest.raises(NoActiveNode, match="n2 is down"):
        routes_from_map(parsed, [0, 1])


@pytest.mark.parametrize("reason, fault", [
    ("state_changed", Fault.MOVED),
    ("shutting_down", Fault.LOST),
    ("too_slow", Fault.LOST),
    ("closed", Fault.FATAL),
    ("something_new", Fault.FATAL),
])
def test_stream_end_reasons(reason: str, fault: Fault) -> None:
    assert fault_of_end(reason) is fault


@pytest.mark.parametrize("status, fault", [("not_my_partition", Fault.MOVED), ("range_error", Fault.FATAL)])
def test_refusals(status: str, fault: Fault) -> None:
    assert fault_of_refusal(status) is fault


ITEM = WorkItem(3, 111, 10, 8, 12, 50, "rollback", 222)


@pytest.mark.parametrize("progress, expected", [
    (None, ITEM),                                                       # nothing read: as planned
    (Progress(10, None, 111), ITEM),                                    # stream opened, no item yet
    (Progress(50, (40, 60), 222), None),                                # reached the end
    (Progress(20, (15, 30), 222, done=True), None),                     # ended (end capped)
    (Progress(30, (15, 30), 222), WorkItem(3, 222, 30, 30, 30, 50, None, 222)),    # whole snapshot
    (Progress(20, (15, 30), 222), WorkItem(3, 222, 20, 15, 30, 50, None, 222)),    # partial snapshot
    (Progress(0, None, 0, reset=True), WorkItem(3, 0, 0, 0, 0, 50, None, 222)),    # after a reset row
    (Progress(5, (1, 9), 333, reset=True), WorkItem(3, 333, 5, 1, 9, 50, None, 222)),
])
def test_a_moved_item_resumes_from_what_it_delivered(progress, expected) -> None:
    assert resume_item(ITEM, progress) == expected


@pytest.mark.parametrize("log, high, branch, end, expected", [
    ([(9, 0)], 100, 9, 80, 80),                         # the planned branch is the newest
    ([(9, 0)], 60, 9, 80, 60),                          # the new active holds less of it
    ([(7, 40), (9, 0)], 100, 9, 80, 40),                # failover branched at 40: stop there
    ([(7, 40), (9, 0)], 100, 7, 80, 80),                # planned on the new branch already
    ([(5, 70), (7, 40), (9, 0)], 90, 7, 80, 70),
    ([(7, 40)], 100, 9, 80, 80),                        # unknown branch: the server decides
    ([(7, 40), (9, 0)], 100, None, 80, 80),
])
def test_reads_stop_where_the_planned_branch_ends(log, high, branch, end, expected) -> None:
    assert reachable_end(log, high, branch, end) == expected


@pytest.mark.parametrize("text, servers", [
    ("http://a:1", ("http://a:1",)),
    ("http://a:1/, https://b:2", ("http://a:1", "https://b:2")),
    (" http://a:1 ,, http://c:3/ ", ("http://a:1", "http://c:3")),
])
def test_server_option_takes_a_node_list(text: str, servers: tuple[str, ...]) -> None:
    opts = parse_options({"server": text})
    assert opts.servers == opts.seeds == servers and opts.server == servers[0]


@pytest.mark.parametrize("text, problem", [(" , ", "no server URL"), ("http://a:1,ftp://b", "ftp://b"),
                                            ("http://a:1,b:2", "'b:2'")])
def test_a_bad_node_list_names_the_option(text: str, problem: str) -> None:
    with pytest.raises(OptionError, match=problem) as info:
        parse_options({"server": text})
    assert info.value.field == "server"
