"""The benchmark harness, so that it cannot rot, without running the benchmark in the product's tests.

``test_the_harness_runs_end_to_end_and_cleans_up`` runs ``python -m bench`` as a user would, at
the smallest size that still goes through every layer (process group, real ``upr server``, a
writer, a consumer process, the JSON results and the printed table), on our server only and with
installs off: the peers (Redis, NATS, PostgreSQL, installed by apt-get) and the full workload set
are what ``make bench`` is for.  Figures are never asserted against thresholds (they are
performance, measured on a shared machine): only that they exist and are well-formed.

The other tests pin the pure parts (document layout, percentiles, rows, the table, sizes,
process stopping, install decisions) with tables.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from bench.suite.docs import DOC_SIZE, doc_index, doc_sent_ns, key_of, make_doc
from bench.suite.results import Report, Row
from bench.suite.sizes import FAST, FULL
from bench.suite.stats import percentiles

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize("i,t", [(0, 0), (7, 123), (9_999_999_999, 2**63 - 1), (123_456, 1_700_000_000_000_000_000)])
def test_doc_is_200_bytes_of_json_with_index_and_stamp_readable_by_slicing(i: int, t: int) -> None:
    d = make_doc(i, t)
    assert len(d) == DOC_SIZE
    parsed = json.loads(d)
    assert (int(parsed["i"]), int(parsed["t"]), parsed["k"]) == (i, t, key_of(i))
    assert (doc_index(d), doc_sent_ns(d)) == (i, t)
    assert (doc_index(d.decode()), doc_sent_ns(d.decode())) == (i, t)  # Postgres hands out str


@pytest.mark.parametrize(
    "values,ps,expected",
    [
        (range(1, 1001), (50, 90, 99, 99.9, 100), {"p50": 500, "p90": 900, "p99": 990, "p99.9": 999, "p100": 1000}),
        ([5.0], (50, 99.9), {"p50": 5.0, "p99.9": 5.0}),
        ([3, 1, 2], (0, 34, 67, 100), {"p0": 1, "p34": 2, "p67": 3, "p100": 3}),  # nearest rank, unsorted input
    ],
)
def test_percentiles_are_nearest_rank(values: list[float], ps: tuple[float, ...], expected: dict[str, float]) -> None:
    assert percentiles(values, ps) == expected


def test_percentiles_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError):
        percentiles([], (50,))


@pytest.mark.parametrize(
    "value,better,ok",
    [(1.0, "higher", True), (0.0, "higher", False), (0.0, "lower", True), (-1.0, "lower", False),
     (math.inf, "higher", False), (math.nan, "lower", False), (None, "higher", False)],
)
def test_an_ok_row_needs_a_real_figure(value: float | None, better: str, ok: bool) -> None:
    if ok:
        Row("w", "s", value, "u", better=better)  # type: ignore[arg-type]
    else:
        with pytest.raises(ValueError):
            Row("w", "s", value, "u", better=better)  # type: ignore[arg-type]
    Row("w", "s", status="skipped", reason="not installed")  # skipped rows carry no figure


def test_table_ratios_and_limit_fractions() -> None:
    r = Report()
    r.add(Row("ingest", "upr", 100_000, "mut/s"))
    r.add(Row("ingest", "redis", 50_000, "mut/s"))
    r.add(Row("tail", "upr", 2.0, "ms p99", better="lower"))
    r.add(Row("tail", "redis", 1.0, "ms p99", better="lower"))
    r.add(Row("ingest", "nats", status="skipped", reason="no package"))
    r.add(Row("limit: LMDB", "limit", 400_000, "items/s", compare_to="ingest"))
    assert [r.ratio_text(row) for row in r.rows] == ["1×", "2.00×", "1×", "0.50×", "—", "upr ingest at 25.0%"]
    lines = r.table().splitlines()
    assert lines[0].startswith("| workload") and len(lines) == 2 + len(r.rows)
    assert "| skipped" in lines[6] and lines[6].endswith("no package |")
    assert len({line.index("|", 2) for line in lines}) == 1  # columns line up
    again = Report.from_json(json.loads(json.dumps(r.to_json())))  # --table-from re-renders a results file
    assert again.table() == r.table()
    assert again.table(notes=False).splitlines()[0].rstrip("| ").endswith("upr advantage")


def test_fast_sizes_are_smaller_than_full() -> None:
    assert FAST.ingest_n < FULL.ingest_n and FAST.backfill_n < FULL.backfill_n
    assert FULL.backfill_n == 1_000_000 and FULL.fanout_consumers == 50 and FULL.tail_rates == (2_500, 10_000)


# ----------------------------------------------------------------------------- the suite itself


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


#: The smallest real run: our server only, two workloads, a few thousand documents, no installs.
SMOKE = ["--systems", "upr", "--workloads", "ingest,backfill", "--no-install", "--budget", "60",
         "--set", "ingest_n=2000", "--set", "backfill_n=2000"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_harness_runs_end_to_end_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    argv = [sys.executable, "-m", "bench", *SMOKE, "--json", str(out)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=150, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())

    # every process the suite started is gone
    assert res["meta"]["processes"], "the suite started no process at all"
    assert [p for p in res["meta"]["processes"] if _alive(p["pid"])] == []

    assert res["systems"]["upr"]["status"] == "ok" and res["systems"]["upr"]["versions"]
    rows = {r["workload"]: r for r in res["rows"] if r["system"] == "upr"}
    assert sorted(rows) == ["backfill", "ingest"]
    late = [w for w, r in rows.items() if r["status"] == "skipped" and r["reason"].startswith("time budget")]
    if late:  # a loaded machine may cut the run short; the row must say so, and something must have run
        warnings.warn(f"the time budget ran out before {late}", stacklevel=1)
    ran = {w: r for w, r in rows.items() if w not in late}
    assert ran, "no workload ran within the time budget"
    for r in ran.values():
        assert r["status"] == "ok", f"{r['workload']}: {r['reason']}"
        assert math.isfinite(r["value"]) and r["value"] > 0 and r["unit"] and r["detail"], r
        assert r["metrics"]["n"] == 2000

    table = proc.stdout
    assert table.startswith("| workload") and "upr advantage" in table.splitlines()[0]
    assert all(f"| {w}" in table for w in rows)


# ----------------------------------------------------------------------------- processes, installs, options


def test_process_group_stops_its_processes_by_pid_even_on_error(tmp_path: Path) -> None:
    from bench.suite.procs import ProcessGroup

    with pytest.raises(RuntimeError), ProcessGroup() as group:
        procs = [group.spawn(["sleep", "60"], name=f"sleeper-{n}", log=tmp_path / f"{n}.log") for n in range(3)]
        assert all(_alive(p.pid) for p in procs)
        raise RuntimeError("workload failed")
    assert [p.returncode for p in procs] == [-15, -15, -15]  # SIGTERM, each by its PID
    assert not any(_alive(p.pid) for p in procs)


def test_a_process_ignoring_its_stop_signal_is_killed(tmp_path: Path) -> None:
    from bench.suite.procs import ProcessGroup

    group = ProcessGroup()
    stubborn = group.spawn([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                            "print('ready', flush=True); time.sleep(60)"], name="stubborn",
                           stdout=subprocess.PIPE)
    assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == b"ready"
    assert group.stop(stubborn, timeout=0.5) == -9


def test_a_missing_peer_is_skipped_with_its_reason_when_installing_is_off() -> None:
    from bench.suite.install import InstallLog, Skip, ensure_debian_package

    with pytest.raises(Skip, match="not installed and installing was disabled"):
        ensure_debian_package(InstallLog(allow=False), "no-such-peer", lambda: None)
    log = InstallLog(allow=False)
    assert ensure_debian_package(log, "sh", lambda: "/bin/sh") == "/bin/sh"
    assert log.steps == [{"what": "sh", "action": "present", "seconds": 0.0, "detail": "/bin/sh"}]


@pytest.mark.parametrize(
    "assignments,expected",
    [
        ([], {}),
        (["backfill_n=2000"], {"backfill_n": 2000}),
        (["tail_rates=100,200", "tail_seconds=0.5"], {"tail_rates": (100, 200), "tail_seconds": 0.5}),
    ],
)
def test_size_overrides(assignments: list[str], expected: dict[str, object]) -> None:
    from bench.suite.cli import override

    sizes = override(FAST, assignments)
    assert {k: v for k, v in sizes.as_dict().items() if v != FAST.as_dict()[k]} == expected


@pytest.mark.parametrize("bad", ["nope=1", "backfill_n", "mode=full", "ws_frames=1", "backfill_n=many"])
def test_bad_size_overrides_are_refused(bad: str) -> None:
    from bench.suite.cli import override

    with pytest.raises(ValueError):
        override(FAST, [bad])
