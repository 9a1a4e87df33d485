"""Split a peer-suite tail run's send->receipt latency into what each process was doing.

    mkdir /tmp/gc /tmp/tail
    UPR_GCPROBE_DIR=/tmp/gc UPR_BENCH_TAIL_DUMP=/tmp/tail PYTHONPATH=$PWD/bench/gcprobe:$PWD \\
        .venv/bin/python -m bench --full --no-install --systems upr,redis --workloads tail --set tail_rates=2500
    PYTHONPATH=$PWD .venv/bin/python -m bench.tail_decompose /tmp/tail /tmp/gc

Per system: the send->receipt percentiles; per process of the run (the suite's writer, the
consumer, the upr server; a peer's server is not Python) the cyclic GC's collections in the run's
window (count, pause percentiles by generation); the share of all writes and of the slowest 1 %
whose send->receipt interval overlapped a collection of 1 ms or more in each process; and for upr
the server's own histograms (hub delivery -> frame handed to the socket; the bulk route's time).
All clocks are ``CLOCK_MONOTONIC``, shared by every process of the machine.
"""
from __future__ import annotations

import argparse
import bisect
import json
import re
from array import array
from pathlib import Path
from typing import Any

from bench.suite.stats import percentiles

PS = (50, 90, 99, 99.9, 100)
SLOW_MS = 1.0  # a collection shorter than this is not counted as a stall


def _load(path: Path) -> array:  # type: ignore[type-arg]
    a = array("q")
    a.frombytes(path.read_bytes())
    return a


def _role(argv: str) -> str:
    if "app.cli server" in argv:
        return "upr server"
    if "bench.suite.child" in argv:
        return "consumer"
    if "-m bench" in argv:
        return "suite (writer)"
    return argv[:60]


def gc_logs(gc_dir: Path) -> list[tuple[str, str, list[tuple[int, int, int, int]]]]:
    """(pid, role, [(generation, start ns, wall ns, cpu ns)]) per process."""
    out = []
    for f in sorted(gc_dir.glob("*.gc")):
        lines = f.read_text().splitlines()
        if not lines:
            continue
        role = _role(lines[0][2:]) if lines[0].startswith("# ") else "?"
        rows = []
        for ln in lines[1:]:
            parts = ln.split()
            if len(parts) >= 4:
                rows.append((int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3])))
        out.append((f.stem, role, rows))
    return out


def histogram(text: str, name: str, labels: str = "") -> dict[str, float]:
    """Cumulative share of observations at or below each bucket of a Prometheus histogram."""
    buckets: dict[float, float] = {}
    pat = re.compile(rf'^{name}_bucket\{{(.*?)\}} ([0-9.e+]+)$')
    for ln in text.splitlines():
        m = pat.match(ln)
        if not m or labels not in m.group(1):
            continue
        le = re.search(r'le="([^"]+)"', m.group(1))
        if le:
            key = float("inf") if le.group(1) == "+Inf" else float(le.group(1))
            buckets[key] = buckets.get(key, 0.0) + float(m.group(2))
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return {}
    return {"n": total, **{f"<= {1e3 * k:g} ms": round(100 * v / total, 1)
                           for k, v in sorted(buckets.items()) if k != float("inf")}}


def decompose(base: Path, logs: list[tuple[str, str, list[tuple[int, int, int, int]]]]) -> dict[str, Any]:
    sent, recv = _load(base.with_suffix(".sent")), _load(base.with_suffix(".recv"))
    writes = [(sent[i], recv[i]) for i in range(len(recv)) if recv[i] >= 0 and sent[i] >= 0]
    lat = sorted((r - s, i) for i, (s, r) in enumerate(writes))
    cut = lat[int(len(lat) * 0.99)][0] if lat else 0
    slow = {i for d, i in lat if d >= cut}
    t0, t1 = min(s for s, _ in writes), max(r for _, r in writes)
    out: dict[str, Any] = {"writes": len(writes),
                           "send_receipt_ms": {k: round(v / 1e6, 2) for k, v in
                                               percentiles([d for d, _ in lat], PS).items()}}
    procs = {}
    for pid, role, rows in logs:
        inside = [r for r in rows if t0 <= r[1] <= t1]
        if not inside:
            continue
        per_gen = {}
        for g in (0, 1, 2):
            walls = [r[2] / 1e6 for r in inside if r[0] == g]
            cpus = [r[3] / 1e6 for r in inside if r[0] == g]
            if walls:
                per_gen[f"gen{g}"] = {"n": len(walls), "wall_sum_ms": round(sum(walls), 1),
                                      "cpu_sum_ms": round(sum(cpus), 1),
                                      **{f"wall_{k}": round(v, 2) for k, v in percentiles(walls, (50, 99, 100)).items()},
                                      **{f"cpu_{k}": round(v, 2) for k, v in percentiles(cpus, (50, 99, 100)).items()}}
        stalls = sorted((r[1], r[1] + r[2]) for r in inside if r[2] >= SLOW_MS * 1e6)
        starts = [a for a, _ in stalls]
        hit = hit_slow = 0
        for i, (s, r) in enumerate(writes):
            # a stall overlaps [s, r] if it starts before r and ends after s
            j = bisect.bisect_right(starts, r)
            if any(stalls[k][1] >= s for k in range(max(0, j - 8), j)):
                hit += 1
                hit_slow += i in slow
        procs[f"{role} ({pid})"] = {"collections": per_gen, f"stalls >= {SLOW_MS:g} ms": len(stalls),
                                    "writes overlapped %": round(100 * hit / len(writes), 2),
                                    "slowest 1 % overlapped %": round(100 * hit_slow / max(1, len(slow)), 1)}
    out["processes"] = procs
    mpath = base.with_suffix(".metrics")
    if mpath.exists():
        text = mpath.read_text()
        out["server delivery (hub -> socket), cumulative %"] = histogram(text, "upr_stream_delivery_seconds")
        out["server bulk route, cumulative %"] = histogram(text, "upr_http_request_duration_seconds", "_bulk")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump_dir", type=Path, help="$UPR_BENCH_TAIL_DUMP of the run")
    ap.add_argument("gc_dir", type=Path, help="$UPR_GCPROBE_DIR of the run")
    args = ap.parse_args()
    logs = gc_logs(args.gc_dir)
    for sent in sorted(args.dump_dir.glob("*.sent")):
        print(json.dumps({sent.stem: decompose(sent.with_suffix(""), logs)}, indent=1))


if __name__ == "__main__":
    main()
