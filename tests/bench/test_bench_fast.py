"""The benchmark suite in fast mode, so that it cannot rot: real peers, real processes, real numbers.

``test_fast_mode_runs_every_installable_system`` runs ``python -m bench`` (fast sizes) as a user
would and checks the JSON and the printed table. Peers missing from the machine are installed by
the suite itself (apt-get as root; measured here: redis-server + nats-server in ~7 s, PostgreSQL's
~20 MB of packages more); set ``UPR_BENCH_NO_INSTALL=1`` to run only the peers present and have
the others reported as skipped. A system that is present must produce real positive figures for
every workload; a skipped one must say why. Figures are never asserted against thresholds
(they are performance, measured on a shared machine): only that they exist and are well-formed.

The other tests pin the pure parts (document layout, percentiles, rows, the table) with tables.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from bench.suite.docs import DOC_SIZE, doc_index, doc_sent_ns, key_of, make_doc
from bench.suite.results import Report, Row
from bench.suite.runner import row_names
from bench.suite.sizes import FAST, FULL
from bench.suite.stats import percentiles

REPO = Path(__file__).resolve().parents[2]
# system -> the workloads it is measured on (None: all)
SYSTEMS = {"upr": None, "upr-memory": ("ingest", "tail"), "upr-clients": ("backfill",),
           "redis": None, "nats": None, "postgres": None}


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


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fast_mode_runs_every_installable_system(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    argv = [sys.executable, "-m", "bench", "--json", str(out), "--budget", "110"]
    if os.environ.get("UPR_BENCH_NO_INSTALL"):
        argv.append("--no-install")
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=380, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())

    # every process the suite started is gone
    assert res["meta"]["processes"], "the suite started no process at all"
    assert [p for p in res["meta"]["processes"] if _alive(p["pid"])] == []

    rows = res["rows"]
    for name, only in SYSTEMS.items():
        feed_names = [n for w in only or ("ingest", "backfill", "tail", "fanout") for n in row_names(w, FAST)]
        info = res["systems"][name]
        mine = {r["workload"]: r for r in rows if r["system"] == name}
        assert sorted(mine) == sorted(feed_names), name
        if info["status"] == "skipped":
            assert info["reason"] and all(r["status"] == "skipped" and r["reason"] for r in mine.values())
            continue
        assert info["status"] == "ok" and info["versions"], name
        # on a machine loaded by other work the run's time budget may cut the last steps of a system:
        # those rows must say so; every other row must hold a real figure, and at least one row does
        late = [w for w, r in mine.items() if r["status"] == "skipped" and r["reason"].startswith("time budget")]
        if late:
            warnings.warn(f"{name}: the time budget ran out before {late}", stacklevel=1)
        mine = {w: r for w, r in mine.items() if w not in late}
        assert mine, f"{name}: no workload ran within the time budget"
        for r in mine.values():
            assert r["status"] == "ok", f"{name} {r['workload']}: {r['reason']}"
            assert math.isfinite(r["value"]) and (r["value"] > 0 or r["better"] == "lower"), r
            assert r["unit"] and r["detail"]
        if "backfill" in mine:
            assert mine["backfill"]["metrics"]["n"] == FAST.backfill_n
        if "ingest" in mine:
            assert mine["ingest"]["metrics"]["n"] == FAST.ingest_n
        for rate in FAST.tail_rates if f"tail {FAST.tail_rates[0]:,}/s" in mine else ():
            m = mine[f"tail {rate:,}/s"]["metrics"]
            assert m["received"] == m["written"] > 0 and m["ack_p50_ms"] <= m["ack_p99_ms"] <= m["ack_p99.9_ms"]

    # the peers this machine can run (or that the suite installed) really ran
    present = {"redis": shutil.which("redis-server"), "nats": shutil.which("nats-server")}
    for name, binary in present.items():
        if binary:
            assert res["systems"][name]["status"] == "ok", res["systems"][name]
    assert res["systems"]["upr"]["status"] == "ok", res["systems"]["upr"].get("reason")

    limits = [r for r in rows if r["system"] == "limit"]
    assert {r["workload"] for r in limits} >= {"limit: LMDB putmulti", "limit: LMDB cursor scan"}
    assert all(r["status"] == "ok" and r["value"] > 0 for r in limits), limits

    table = proc.stdout
    assert table.startswith("| workload") and "upr advantage" in table.splitlines()[0]
    for r in rows:
        assert f"| {r['workload']}" in table
    # a ratio wherever both figures exist (upr's row may be cut by the time budget on a loaded
    # machine, and a latency p99 of 0 - every document before its ack - has no finite ratio)
    ours = {r["workload"]: r for r in rows if r["system"] == "upr"}
    comparable = [
        r for r in rows
        if r["system"] in ("redis", "nats", "postgres") and r["status"] == "ok"
        and ours.get(r["workload"], {}).get("status") == "ok" and ours[r["workload"]]["value"] > 0
    ]
    assert all(r["upr_advantage"].endswith("×") for r in comparable), [
        (r["workload"], r["system"], r["upr_advantage"]) for r in comparable]
    assert all(r["upr_advantage"] == "—" for r in rows
               if r["system"] in ("redis", "nats", "postgres") and r not in comparable)


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
