"""Split each tail request's send->receipt into its stages (``bench/tailprobe``'s stamps).

    PYTHONPATH=$PWD .venv/bin/python -m bench.tail_stages_match /tmp/tail /tmp/probe

The suite's writer is closed-loop: the writes of one request share their send time, so the
writes grouped by send time are the requests, in order, one-to-one with the server's ``R``
stamps.  Per request: sent -> route starts (client, HTTP, parse) -> writer job starts (thread
hop) -> job ends (parse + apply) -> the next hub delivery starts (writer -> loop wake) -> the
next stream message written (the pass) -> the consumer's first receipt of the request's writes;
and the route's answer (the ack side: for a ``persist`` request, the flush round that persisted it,
from its job's end to the round's start, the round, and the round's end to the answer).  Percentiles in ms, plus the batch size and the server
thread CPU the stamps carry (the job's, the delivery's).
"""
from __future__ import annotations

import bisect
import sys
from array import array
from pathlib import Path

from bench.suite.stats import percentiles

PS = (50, 90, 99)


def _load(path: Path) -> array:  # type: ignore[type-arg]
    a = array("q")
    a.frombytes(path.read_bytes())
    return a


def _events_of_run(probe_dir: Path, t0: int, t1: int) -> dict[str, list[tuple[int, int]]]:
    """The stamps of the server that served this run (one file per server process): the one
    with the most route stamps between the run's first and last send."""
    best: dict[str, list[tuple[int, int]]] = {}
    best_n = -1
    for f in probe_dir.glob("*.stages"):
        ev: dict[str, list[tuple[int, int]]] = {t: [] for t in "RJjDdWAFf"}
        for line in f.read_text().splitlines():
            t, ns, c = line.split()
            ev[t].append((int(ns), int(c)))
        n = sum(1 for ns, _ in ev["R"] if t0 <= ns <= t1 + 10**9)
        if n > best_n:
            best, best_n = ev, n
    return best


def main(tail_dir: str, probe_dir: str, name: str = "upr-tail-2500") -> None:
    base = Path(tail_dir) / name
    sent, recv = _load(base.with_suffix(".sent")), _load(base.with_suffix(".recv"))
    reqs: list[tuple[int, int, int]] = []  # (sent ns, first write, end write)
    i = 0
    while i < len(sent) and sent[i] >= 0:
        j = i
        while j < len(sent) and sent[j] == sent[i]:
            j += 1
        reqs.append((sent[i], i, j))
        i = j
    ev = _events_of_run(Path(probe_dir), reqs[0][0], reqs[-1][0])
    rt = [e[0] for e in ev["R"]]
    first = bisect.bisect_left(rt, reqs[0][0])  # route stamps of earlier workloads/requests
    d_starts = [e[0] for e in ev["D"]]
    w_times = [e[0] for e in ev["W"]]
    f_starts = [e[0] for e in ev["F"]]
    stages: dict[str, list[float]] = {k: [] for k in (
        "send->route", "route->job", "job (parse+apply)", "applied->delivery", "delivery->written",
        "written->received", "send->received", "send->ack(route end)", "batch", "job cpu ms", "delivery cpu ms",
        "job wall-cpu ms", "delivery wall-cpu ms", "applied->round starts", "round (build+commit)",
        "round cpu ms", "round end->answer", "applied->answer")}
    n = min(len(reqs), len(rt) - first)
    for k in range(n):
        s, a, b = reqs[k]
        r, ans = ev["R"][first + k][0], ev["A"][first + k][0]
        j0, j1 = ev["J"][first + k], ev["j"][first + k]
        di = bisect.bisect_left(d_starts, j0[0])  # the marks are made inside the job
        if di >= len(d_starts):
            break
        d0 = d_starts[di]
        wi = bisect.bisect_left(w_times, d0)
        if wi >= len(w_times):
            break
        w = w_times[wi]
        got = [recv[x] for x in range(a, b) if recv[x] >= 0]
        if not got:
            continue
        rc = min(got)
        for key, v in (("send->route", r - s), ("route->job", j0[0] - r), ("job (parse+apply)", j1[0] - j0[0]),
                       ("applied->delivery", d0 - j1[0]), ("delivery->written", w - d0),
                       ("written->received", rc - w), ("send->received", rc - s), ("send->ack(route end)", ans - s),
                       ("job cpu ms", j1[1] - j0[1]), ("delivery cpu ms", ev["d"][di][1] - ev["D"][di][1])):
            stages[key].append(v / 1e6)
        stages["batch"].append(b - a)
        stages["job wall-cpu ms"].append(((j1[0] - j0[0]) - (j1[1] - j0[1])) / 1e6)
        dd = ev["d"][di]
        stages["delivery wall-cpu ms"].append(((dd[0] - d0) - (dd[1] - ev["D"][di][1])) / 1e6)
        stages["applied->answer"].append((ans - j1[0]) / 1e6)
        # the flush round that persisted the request: the first to start after its job ended
        # (its items were published inside the job); only when the answer waited for it
        fi = bisect.bisect_left(f_starts, j1[0])
        if fi < len(f_starts) and fi < len(ev["f"]) and ev["f"][fi][0] <= ans:
            f0, f1 = ev["F"][fi], ev["f"][fi]
            stages["applied->round starts"].append((f0[0] - j1[0]) / 1e6)
            stages["round (build+commit)"].append((f1[0] - f0[0]) / 1e6)
            stages["round cpu ms"].append((f1[1] - f0[1]) / 1e6)
            stages["round end->answer"].append((ans - f1[0]) / 1e6)
    print(f"{n} requests matched ({len(reqs)} sent, {len(rt) - first} routed)")
    for key, vals in stages.items():
        p = percentiles(vals, PS) if vals else {}
        print(f"  {key:24s} " + "  ".join(f"p{q} {p.get(f'p{q}', float('nan')):8.2f}" for q in PS)
              + f"  mean {sum(vals) / max(1, len(vals)):8.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
