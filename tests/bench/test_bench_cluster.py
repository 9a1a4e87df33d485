"""``bench.bench_cluster``'s harness, so that it cannot rot, without running the benchmark in the tests.

The pure arithmetic (lags from acks and replica polls, ratios, verdicts, routing of load
bodies) is pinned by tables; one slow test runs the whole script at its smallest size on real
etcd and real nodes (one failover round, a second of each phase) and checks that every figure
is there and well-formed and that every process it started is gone.  Figures are never compared
with their goals here: they are performance, measured on a shared machine.
"""
from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from bench.cluster_figures import (
    STAGES,
    Ack,
    Figure,
    Poll,
    median_ratio,
    poll_period,
    replica_lags,
    stage_lags,
    table,
    verdict,
)
from bench.cluster_lag import LagResult, acked_highs, cpu_per_write_us
from bench.cluster_load import routed_bodies
from bench import cluster_poll
from bench.cluster_poll import Stop
from bench.cluster_procs import key_in_partition, partition_of

REPO = Path(__file__).resolve().parents[2]


def poll(sent: float, received: float, **highs: int) -> Poll:
    return Poll(sent, received, {int(p.removeprefix("p")): h for p, h in highs.items()})


@pytest.mark.parametrize(
    "acks,polls,lags,unseen",
    [
        # the first poll covering the seqno counts, at its midpoint
        ([Ack(0, 5, 1.0)], [poll(0.9, 1.0, p0=4), poll(1.002, 1.004, p0=5), poll(1.01, 1.02, p0=9)], [0.003], 0),
        # a poll that skips past the seqno covers it too
        ([Ack(0, 5, 1.0)], [poll(1.0, 1.01, p0=3), poll(1.02, 1.03, p0=8)], [0.025], 0),
        # held before the ack reached the writer: 0, never negative
        ([Ack(0, 5, 1.0)], [poll(0.5, 0.6, p0=7)], [0.0], 0),
        # never covered while polling: counted apart, not as a lag
        ([Ack(0, 5, 1.0), Ack(0, 9, 1.1)], [poll(1.0, 1.2, p0=6)], [0.1], 1),
        # partitions are matched with their own high seqnos only
        ([Ack(1, 2, 1.0), Ack(0, 2, 1.0)], [poll(1.0, 1.002, p0=2), poll(1.01, 1.012, p0=2, p1=2)], [0.011, 0.001], 0),
        # a partition no poll shows (not a replica on this node) is unseen
        ([Ack(3, 1, 1.0)], [poll(1.0, 1.1, p0=1)], [], 1),
        ([], [], [], 0),
    ],
)
def test_replica_lags_take_the_first_covering_poll(acks: list[Ack], polls: list[Poll], lags: list[float],
                                                   unseen: int) -> None:
    got, missing = replica_lags(acks, polls)
    assert sorted(got) == pytest.approx(sorted(lags))
    assert missing == unseen


def test_stage_lags_take_each_writes_first_covering_stamps() -> None:
    acks = [Ack(0, 5, 1.0), Ack(0, 6, 1.0), Ack(1, 2, 2.0), Ack(2, 1, 3.0)]
    # partition 0: seqnos up to 5 came in one batch, 6 in the next; partition 2 never arrived
    trace = [[0, 5, 1.010, 1.012, 1.020], [1, 3, 2.1, 2.2, 2.25], [0, 6, 1.030, 1.031, 1.032]]
    actives = [poll(0, 1.004, p0=6, p1=1), poll(0, 2.05, p1=2)]
    replicas = [poll(0, 1.025, p0=5), poll(0, 1.040, p0=6), poll(0, 2.3, p1=3), poll(0, 3.5, p2=1)]
    stages, missing = stage_lags(acks, trace, actives, replicas)
    assert missing == 1
    expected = {  # per stage: (seqno 5, seqno 6, partition 1)
        STAGES[0]: [0.004, 0.004, 0.05],
        STAGES[1]: [0.010, 0.030, 0.1],
        STAGES[2]: [0.002, 0.001, 0.1],
        STAGES[3]: [0.008, 0.001, 0.05],
        STAGES[4]: [0.005, 0.008, 0.05],
        STAGES[5]: [0.020, 0.032, 0.25],
    }
    assert stages.keys() == expected.keys()
    for stage, values in expected.items():
        assert stages[stage] == pytest.approx(values), stage


def test_poll_period_is_the_median_gap() -> None:
    assert poll_period([poll(0, 1.0), poll(0, 1.002), poll(0, 1.003), poll(0, 1.010)]) == pytest.approx(0.002)
    assert math.isnan(poll_period([poll(0, 1.0)]))


@pytest.mark.parametrize(
    "num,den,median,ratios",
    [([2.0], [1.0], 2.0, [2.0]), ([1.0, 3.0, 2.0], [2.0, 2.0, 2.0], 1.0, [0.5, 1.5, 1.0]), ([1.0], [0.0], None, [])],
)
def test_ratios_are_taken_per_round(num: list[float], den: list[float], median: float | None,
                                    ratios: list[float]) -> None:
    got, each = median_ratio(num, den)
    assert each == ratios
    assert math.isnan(got) if median is None else got == median


@pytest.mark.parametrize(
    "value,goal,higher,expected",
    [(0.8, 0.7, True, "met"), (0.6, 0.7, True, "NOT met"), (2.9, 3.0, False, "met"), (math.inf, 3.0, False, "NOT met"),
     (None, 3.0, False, "n/a"), (math.nan, 0.7, True, "n/a")],
)
def test_verdicts(value: float | None, goal: float, higher: bool, expected: str) -> None:
    assert verdict(value, goal, higher) == expected


def test_table_has_one_row_per_figure_and_the_methods_below() -> None:
    text = table([Figure("a", "1", "≥ 2", "NOT met", "how a"), Figure("b", "n/a", "≥ 1", "n/a")])
    lines = text.splitlines()
    assert lines[0] == "| figure | result | goal | verdict |" and lines[2:4] == ["| a | 1 | ≥ 2 | NOT met |",
                                                                             "| b | n/a | ≥ 1 | n/a |"]
    assert lines[-1] == "- a: how a"


@pytest.mark.parametrize("partitions", [1, 16, 64])
def test_probe_keys_land_in_their_partition(partitions: int) -> None:
    for p in range(partitions):
        assert partition_of(key_in_partition(p, partitions, "probe"), partitions) == p


def test_load_bodies_go_to_their_partitions_node() -> None:
    targets = {p: "http://a" if p % 2 else "http://b" for p in range(8)}
    bodies = routed_bodies(targets, 8, "k", batch=10, per_node=3, seed=1)
    assert sorted(bodies) == ["http://a", "http://b"]
    for url, mine in bodies.items():
        assert len(mine) == 3
        for body in mine:
            items = orjson.loads(body)
            assert len(items) == 10
            assert all(targets[partition_of(i["key"], 8)] == url and i["op"] == "set" for i in items)
    keys = [i["key"] for mine in bodies.values() for body in mine for i in orjson.loads(body)]
    assert len(keys) == len(set(keys))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_cluster_benchmark_runs_end_to_end_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    argv = [sys.executable, "-m", "bench.bench_cluster", "--quick", "--rounds", "1", "--partitions", "8",
            "--seed-items", "50", "--lag-seconds", "1", "--durable", "persist",
            "--json", str(out)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    print(proc.stderr[-3000:])  # shown if an assertion below fails
    assert res["processes"] and [p for p in res["processes"] if _alive(p["pid"])] == []
    names = [f["name"] for f in res["figures"]]
    assert names[0] == "failover time" and names[1].startswith("replication lag at 5,000/s")
    assert names[2].endswith("(baseline)") and names[3].startswith("persist / memory") and len(names) == 5
    for f in res["figures"]:
        # persist is accepted, so every figure was measured; the baseline has no goal
        assert f["verdict"] in (("—",) if "baseline" in f["name"] else ("met", "NOT met")), f
        assert f["result"] and f["method"]
    assert proc.stdout.count("\n| ") == 6  # header row and five figures (the separator row starts with |-)


@pytest.mark.parametrize(("node_cpu", "seconds", "sent", "expected_us"), [
    ([0.5, 0.5], 20.0, 100_000, 200.0),  # a core's worth of CPU spread over 100,000 writes
    ([0.25, 0.15], 10.0, 50_000, 80.0),
    ([0.5, 0.5], 20.0, 0, math.nan),
])
def test_cpu_per_write(node_cpu, seconds, sent, expected_us) -> None:
    res = LagResult(5000.0, [], 0, sent, 0, seconds, 5.0, 0, node_cpu, 0.0)
    got = cpu_per_write_us(res)
    assert (math.isnan(got) and math.isnan(expected_us)) or got == pytest.approx(expected_us)


def test_the_apply_bench_runs_at_a_tiny_size(capsys) -> None:
    from bench import cluster_apply

    assert cluster_apply.main(["--items", "300", "--partitions", "4", "--run", "16"]) == 0
    out = capsys.readouterr().out
    assert out.count(" µs | ") == 3 and out.count("\n| one engine call") == 3


def test_the_apply_bench_feeds_whole_snapshots_in_order() -> None:
    from bench.cluster_apply import passes
    from engine.replica import ItemsStep, MarkerStep

    steps = passes(4, 50, 1)
    assert sum(len(s.items) for s in steps if type(s) is ItemsStep) == 50
    high = {p: 0 for p in range(4)}
    for marker, batch in zip(steps[::2], steps[1::2]):
        assert type(marker) is MarkerStep and type(batch) is ItemsStep and batch.last
        assert marker.start == high[marker.partition] + 1
        assert [i.seqno for i in batch.items] == list(range(marker.start, marker.end + 1))
        high[marker.partition] = marker.end


def test_handover_phases_and_gaps_are_computed_from_their_marks() -> None:
    from bench.cluster_gap import longest_gap
    from bench.cluster_phases import HandoverMarks, phase_rows

    assert longest_gap([], 1.0, 3.0) == 2.0
    assert longest_gap([1.5, 1.6, 2.9], 1.0, 3.0) == pytest.approx(1.3)
    marks = {0: HandoverMarks("a", "b", created=1.0, fenced=1.1, switched=1.1, taken_over=1.2,
                              first_refused=1.05, first_misdirected=1.25, accepted=1.3)}
    rows = dict(phase_rows(marks, [0, 1]))
    assert rows["fence recorded -> map switched"].startswith("p50 0 ms")
    assert rows["first refused write sent -> accepted"].startswith("p50 250 ms")
    assert rows["map switched -> target took over"].endswith("over 1")


def test_probe_answers_give_the_pause_and_the_handover_marks() -> None:
    from bench.cluster_phases import HandoverMarks, PhaseWatch
    from bench.cluster_rebalance import _accepted_within, _read_answers

    phases = PhaseWatch("http://unused", "/upr")
    phases.marks[0] = HandoverMarks("a", "b", created=1.0)
    answers = [  # [partition, status, sent, answered], in the order they came back
        [0, 200, 0.90, 0.95],
        [1, 503, 0.50, 0.60],   # refused with no handover record: counts, but marks nothing
        [0, 421, 1.02, 1.30],   # the pause starts at this send
        [0, 200, 1.31, 1.40],   # ... and ends at this answer, from the new active
        [1, 201, 0.61, 0.70],
        [0, 200, 1.41, 1.45],
    ]
    seen = _read_answers(answers, phases)
    assert seen.pauses == {0: pytest.approx(0.38), 1: pytest.approx(0.20)}
    assert seen.refused == 2 and seen.answers == {0: {421: 1}, 1: {503: 1}}
    m = phases.marks[0]
    assert (m.first_refused, m.first_misdirected, m.accepted_sent, m.accepted) == (1.02, 1.30, 1.31, 1.40)
    assert 1 not in phases.marks
    assert _accepted_within(answers, 1.0, 2.0) == [pytest.approx(0.09), pytest.approx(0.04)]


def test_paced_probes_write_fast_only_where_a_handover_is_under_way() -> None:
    """A quiet partition's probe waits its cold interval, a partition whose handover record
    stands its hot one, and a probe waiting out a cold interval writes at once when its partition
    turns hot: the measurement's resolution is kept where the pause is, not its load everywhere."""
    from bench.rebalance_probes import HOT_AFTER_S, Pace, Probes

    async def scenario() -> tuple[float, float, float, float]:
        probes = Probes(["http://unused"], 4, Pace(hot_s=0.005, cold_s=5.0))
        probes.hot.add(1)
        probes.hot_until[2] = time.monotonic() + HOT_AFTER_S
        intervals = (probes.interval(0), probes.interval(1), probes.interval(2))
        began = time.monotonic()
        waiting = asyncio.create_task(probes.until_due(3, time.monotonic()))
        await asyncio.sleep(0.05)
        probes.hot.add(3)
        probes.woken[3].set()  # what the watch of the records does
        await asyncio.wait_for(waiting, 2.0)
        return (*intervals, time.monotonic() - began)

    cold, hot, cooling, woke_after = asyncio.run(scenario())
    assert (cold, hot, cooling) == (5.0, 0.005, 0.005)
    assert woke_after < 2.0
    assert Probes(["http://unused"], 1).pace.closed_loop


def test_fence_steps_are_read_from_the_nodes_log_lines() -> None:
    from bench.cluster_phases import fence_steps, step_rows

    lines = [
        "WARNING node rb1: partition 3 stopped taking writes at seqno 12 and, acknowledged by node rb3, is active "
        "there from map revision 7 (switched by its source); catch-up 4 ms, stop 1 ms, ack of 2 item(s) 9 ms, "
        "switch 31 ms",
        "WARNING node rb2: partition 5 stopped taking writes at seqno 8 for its handover to node rb3; catch-up 0 ms, "
        "stop 0 ms, ack 500 ms, record 20 ms",
        "WARNING node rb3: partition 3 taken over as active (map revision 7, 12 ms after the map came, 1 ms of them "
        "in take_over), failover log kept",
        "WARNING node rb3: partition 9 promoted to active (map revision 8): new history branch 1 at seqno 4",
    ]
    steps = fence_steps(lines)
    assert steps == {"source: catch-up": [4.0, 0.0], "source: stop": [1.0, 0.0], "source: ack": [9.0, 500.0],
                     "source: ack items": [2.0], "source: switch": [31.0], "source: record": [20.0],
                     "target: map came -> taken over": [12.0], "target: in take_over": [1.0]}
    rows = dict(step_rows(steps))
    assert rows["source: ack"] == "p50 9 ms, p99 500 ms, max 500 ms over 2"
    assert rows["source: ack items"] == "median 2, max 2 over 1"


def test_the_observer_stops_once_it_saw_what_the_replicas_hold() -> None:
    """A bare stop ends every observation; a stop naming seqnos keeps a node's observation going
    until it saw them (or its grace passed), so writes a replica took just before the stop are
    not counted as never seen."""
    bare = Stop()
    assert not bare.done("http://a", {}, 0.0)
    bare.set("stop\n")
    assert bare.done("http://a", {}, 0.0)

    replica_of = {0: "http://a", 1: "http://b"}
    wanted = acked_highs(replica_of, [Ack(0, 5, 1.0), Ack(0, 7, 1.1), Ack(1, 3, 1.0)])
    assert wanted == {"http://a": {0: 7}, "http://b": {1: 3}}
    named = Stop(grace_s=60.0)
    named.set("stop " + orjson.dumps(wanted, option=orjson.OPT_NON_STR_KEYS).decode() + "\n")
    now = time.monotonic()
    assert not named.done("http://a", {0: 6}, now)
    assert named.done("http://a", {0: 7}, now)
    assert named.done("http://b", {1: 3}, now)
    assert named.done("active http://a", {}, now)  # an observation nobody named stops at once
    assert named.done("http://a", {0: 6}, now + 61.0)  # the grace ends the wait


def test_the_observer_says_ready_only_once_every_observation_is_set_up(monkeypatch) -> None:
    """The window is read (the benchmark's handshake) only after every observation said it is
    set up; each then gets the same window, and the stop reader starts after the window's line."""
    asked: list[str] = []
    monkeypatch.setattr(cluster_poll, "wait_for_start", lambda: asked.append("window") or (1.0, 2.0))

    async def scenario() -> list[tuple[float, float]]:
        window = cluster_poll.Window(2, on_release=lambda: asked.append("stop reader"))
        released = asyncio.ensure_future(window.release())
        first = asyncio.ensure_future(window.ready())
        await asyncio.sleep(0.05)
        assert asked == [] and not first.done()  # one observation is still setting up
        second = await window.ready()
        await released
        return [await first, second]

    assert asyncio.run(scenario()) == [(1.0, 2.0), (1.0, 2.0)]
    assert asked == ["window", "stop reader"]
