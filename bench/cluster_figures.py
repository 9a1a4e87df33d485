"""The pure arithmetic of ``bench.bench_cluster``: replication lags from acks and replica polls,
summaries, ratios and the printed table.  Table-tested in ``tests/bench/test_bench_cluster.py``.
"""
from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.suite.stats import percentiles


@dataclass(frozen=True, slots=True)
class Ack:
    """The writer received the active's acknowledgement of ``seqno`` in ``partition`` at ``t`` (monotonic s)."""

    partition: int
    seqno: int
    t: float


@dataclass(frozen=True, slots=True)
class Poll:
    """One read of a replica node's high seqnos: request sent at ``sent``, answer read at ``received``."""

    sent: float
    received: float
    highs: dict[int, int]


def replica_lags(acks: Iterable[Ack], polls: Sequence[Poll]) -> tuple[list[float], int]:
    """Seconds from each ack to the first poll that shows the replica holding it, and how many acks
    no poll ever showed.

    The replica's state is read somewhere between a poll's ``sent`` and ``received``: the poll's
    midpoint stands for it, so a figure is within half a poll round trip plus one poll period of
    the truth.  A replica seen holding a write before its ack reached the writer counts 0 (the
    active sends to its replicas as it acknowledges; the race is below the method's resolution).
    ``polls`` are in the order they were taken, and a partition's high seqno never falls between
    them (no rollback while measuring).
    """
    by_partition: dict[int, list[Ack]] = {}
    for ack in acks:
        by_partition.setdefault(ack.partition, []).append(ack)
    lags: list[float] = []
    unseen = 0
    for p, mine in by_partition.items():
        times = [(poll.sent + poll.received) / 2 for poll in polls if p in poll.highs]
        highs = [poll.highs[p] for poll in polls if p in poll.highs]
        for ack in mine:
            i = bisect.bisect_left(highs, ack.seqno)  # the first poll whose high seqno covers the ack
            if i == len(highs):
                unseen += 1
            else:
                lags.append(max(0.0, times[i] - ack.t))
    return lags, unseen


def poll_period(polls: Sequence[Poll]) -> float:
    """Median seconds between consecutive polls of one node (the method's resolution)."""
    gaps = [b.received - a.received for a, b in zip(polls, polls[1:])]
    return statistics.median(gaps) if gaps else float("nan")


def summary_ms(values: Sequence[float], ps: Sequence[float] = (50, 99, 100)) -> dict[str, float]:
    """Nearest-rank percentiles of seconds, in milliseconds (``p100`` is the max)."""
    return {k: v * 1000 for k, v in percentiles(values, ps).items()}


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> tuple[float, list[float]]:
    """Each round's ratio (numerator and denominator measured in the same round) and their median."""
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True) if d > 0]
    return (statistics.median(ratios) if ratios else float("nan")), ratios


@dataclass(frozen=True, slots=True)
class Figure:
    """One row of the table: what, the measured result, the goal and whether it is met."""

    name: str
    result: str
    goal: str
    verdict: str
    method: str = ""


def verdict(value: float | None, goal: float, higher_is_better: bool) -> str:
    """met / NOT met against ``goal``; n/a when nothing was measured (None or NaN; infinity is a
    measurement: something never happened)."""
    if value is None or value != value:
        return "n/a"
    met = value >= goal if higher_is_better else value <= goal
    return "met" if met else "NOT met"


def table(figures: Sequence[Figure]) -> str:
    lines = ["| figure | result | goal | verdict |", "|---|---|---|---|"]
    lines += [f"| {f.name} | {f.result} | {f.goal} | {f.verdict} |" for f in figures]
    notes = [f"- {f.name}: {f.method}" for f in figures if f.method]
    return "\n".join(lines + ([""] + notes if notes else []))


#: the stages of ``stage_lags``, in the order a write goes through them
STAGES = ("ack → active's tail", "ack → replica received", "received → applier took it", "took → applied",
          "applied → observer saw it", "ack → applied")


def _first_covering(times: Sequence[float], seqnos: Sequence[int], seqno: int) -> float | None:
    i = bisect.bisect_left(seqnos, seqno)
    return times[i] if i < len(seqnos) else None


def stage_lags(acks: Iterable[Ack], trace: Iterable[Sequence[float]], active_polls: Sequence[Poll],
               replica_polls: Sequence[Poll]) -> tuple[dict[str, list[float]], int]:
    """Seconds each write spent in each of ``STAGES``, and how many acks lacked a stamp.

    ``trace`` holds the replicas' stamps ``[partition, last seqno, arrived, taken, applied]``
    (``app.cluster.lag_trace``), a record per received batch; ``active_polls`` come from tails
    of the actives (when the active's stream server pushed a write to a consumer: the pace of
    its replication sender, which is served by the same passes) and ``replica_polls`` from the
    observer's tails of the replicas.  The last stage, ack → applied, is the issue's lag itself
    (the replica holds the write in memory) without the observer's own delay.  A write's stamps are those of the first record that
    covers its seqno.  The first stage may be negative: the active pushes before the writer
    has read its HTTP answer."""
    stamps: dict[int, list[Sequence[float]]] = {}
    for record in trace:
        stamps.setdefault(int(record[0]), []).append(record)

    def series(polls: Sequence[Poll], p: int) -> tuple[list[float], list[int]]:
        return [poll.received for poll in polls if p in poll.highs], [poll.highs[p] for poll in polls if p in poll.highs]

    out: dict[str, list[float]] = {name: [] for name in STAGES}
    missing = 0
    cache: dict[int, Any] = {}
    for ack in acks:
        p = ack.partition
        if p not in cache:
            records = sorted(stamps.get(p, []), key=lambda r: r[2])
            cache[p] = (records, [int(r[1]) for r in records], series(active_polls, p), series(replica_polls, p))
        records, seqnos, (a_times, a_highs), (r_times, r_highs) = cache[p]
        i = bisect.bisect_left(seqnos, ack.seqno)
        pushed = _first_covering(a_times, a_highs, ack.seqno)
        seen = _first_covering(r_times, r_highs, ack.seqno)
        if i == len(records) or pushed is None or seen is None:
            missing += 1
            continue
        _p, _s, arrived, taken, applied = records[i]
        for name, value in zip(STAGES, (pushed - ack.t, arrived - ack.t, taken - arrived, applied - taken,
                                        seen - applied, applied - ack.t)):
            out[name].append(value)
    return out, missing
