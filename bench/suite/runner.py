"""Runs the selected workloads on each system in turn and collects one :class:`Report`.

Systems run one after the other, each with its own :class:`ProcessGroup` (so a peer never competes
with another for the two cores, and everything a system started is stopped by PID before the next
one starts). A system that cannot be installed or started yields ``skipped`` rows with the reason;
a workload that fails yields an ``error`` row with the message; neither stops the run.
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from bench.suite import workloads as wl
from bench.suite.adapter import System
from bench.suite.install import InstallLog, Skip
from bench.suite.procs import SPAWNED, ProcessGroup, StartError
from bench.suite.results import Report, Row
from bench.suite.sizes import Sizes

FEED_WORKLOADS = ("ingest", "backfill", "tail", "fanout")


def all_systems() -> list[System]:
    from bench.peers.nats import NatsSystem
    from bench.peers.postgres import PostgresSystem
    from bench.peers.redis import RedisSystem
    from bench.suite.upr import UprMemorySystem, UprSystem
    from bench.suite.upr_client import UprClientSystem

    return [UprSystem(), UprMemorySystem(), UprClientSystem(), RedisSystem(), NatsSystem(), PostgresSystem()]


def row_names(workload: str, sizes: Sizes) -> list[str]:
    """The workload column of the rows a workload produces (used for skipped and error rows)."""
    if workload == "tail":
        return [f"tail {r:,}/s" for r in sizes.tail_rates]
    if workload == "fanout":
        tag = f"fan-out {sizes.fanout_consumers}×{sizes.fanout_rate:,}/s"
        return [tag, tag + " lag"]
    return [workload]


def _steps(workload: str, sizes: Sizes) -> list[tuple[list[str], Callable[[System, wl.Ctx], Awaitable[list[Row]]]]]:
    if workload == "ingest":
        return [(["ingest"], wl.ingest)]
    if workload == "backfill":
        return [(["backfill"], wl.backfill)]
    if workload == "tail":
        return [([f"tail {r:,}/s"], lambda s, c, r=r: wl.tail(s, c, r)) for r in sizes.tail_rates]
    if workload == "fanout":
        return [(row_names("fanout", sizes), wl.fanout)]
    raise ValueError(workload)


class Runner:
    def __init__(self, sizes: Sizes, install: InstallLog, workloads: list[str], budget_s: float,
                 keep_dir: bool = False, say: Callable[[str], None] = print) -> None:
        self.sizes = sizes
        self.install = install
        self.workloads = workloads
        self.budget_s = budget_s
        self.deadline = time.monotonic() + budget_s
        self.keep_dir = keep_dir
        self.say = say
        self.report = Report()

    def _mark(self, system: str, names: list[str], status: str, reason: str) -> None:
        for n in names:
            self.report.add(Row(n, system, status=status, reason=reason))  # type: ignore[arg-type]

    async def run(self, systems: list[System]) -> Report:
        r = self.report
        r.meta = {
            "command": " ".join([os.path.basename(sys.executable), "-m", "bench", *sys.argv[1:]]),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "sizes": self.sizes.as_dict(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                     "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
        }
        with tempfile.TemporaryDirectory(prefix="upr-bench-") as tmp:
            root = Path(tmp)
            steps = [len(self._feed_steps(s)) for s in systems]
            for n, system in enumerate(systems):
                # its share of what is left (by number of steps), so one slow system cannot starve the rest
                share = max(0.0, self.deadline - time.monotonic()) * steps[n] / max(1, sum(steps[n:]))
                await self._run_system(system, root / system.name, share)
            if "limits" in self.workloads:
                from bench.suite.limits import limits

                with ProcessGroup() as procs:
                    ctx = wl.Ctx(procs, root / "limits", self.sizes)
                    ctx.workdir.mkdir()
                    try:
                        for row in await asyncio.wait_for(limits(ctx), self.sizes.workload_timeout_s * 2):
                            r.add(row)
                    except Exception as exc:  # noqa: BLE001 - shown in the table
                        self._mark("limit", ["limits"], "error", f"{type(exc).__name__}: {exc}")
            if self.keep_dir:
                import shutil

                kept = Path(tempfile.mkdtemp(prefix="upr-bench-kept-"))
                shutil.copytree(root, kept, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.mdb", "*.recv"))
                r.meta["kept_dir"] = str(kept)
        r.meta["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        r.meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        r.meta["processes"] = [{"pid": pid, "name": name} for pid, name in SPAWNED]
        r.installs = self.install.steps
        order = {s.name: i for i, s in enumerate(systems)}
        names = [n for w in self.workloads if w in FEED_WORKLOADS for n in row_names(w, self.sizes)]
        r.rows.sort(key=lambda row: (names.index(row.workload) if row.workload in names else len(names),
                                     order.get(row.system, len(order))))
        return r

    def _feed(self, system: System) -> list[str]:
        return [w for w in self.workloads if w in FEED_WORKLOADS and (system.only is None or w in system.only)]

    def _feed_steps(self, system: System) -> list[object]:
        return [step for w in self._feed(system) for step in _steps(w, self.sizes)]

    async def _run_system(self, system: System, workdir: Path, share_s: float) -> None:
        feed = self._feed(system)
        if not feed:
            return
        all_names = [n for w in feed for n in row_names(w, self.sizes)]
        info = {"label": system.label, "durability": system.durability, "method": system.method}
        self.report.systems[system.name] = info
        t0 = time.monotonic()
        try:
            info["versions"] = await asyncio.to_thread(system.prepare, self.install)
        except Skip as exc:
            self.deadline += time.monotonic() - t0  # installing is not part of the budget
            info.update(status="skipped", reason=str(exc))
            self._mark(system.name, all_names, "skipped", str(exc))
            self.say(f"[{system.name}] skipped: {exc}")
            return
        self.deadline += time.monotonic() - t0
        deadline = time.monotonic() + share_s
        workdir.mkdir(parents=True)
        with ProcessGroup() as procs:
            try:
                await asyncio.wait_for(system.start(procs, workdir), 120)
            except (Skip, StartError, OSError, TimeoutError) as exc:
                info.update(status="skipped", reason=f"could not start: {exc}")
                self._mark(system.name, all_names, "skipped", f"could not start: {exc}")
                self.say(f"[{system.name}] could not start: {exc}")
                return
            info["status"] = "ok"
            ctx = wl.Ctx(procs, workdir, self.sizes)
            try:
                for w in feed:
                    for names, step in _steps(w, self.sizes):
                        if time.monotonic() > deadline:
                            self._mark(system.name, names, "skipped",
                                       f"time budget exhausted (this system's share of --budget {self.budget_s:g}s)")
                            continue
                        t1 = time.monotonic()
                        try:
                            rows = await asyncio.wait_for(step(system, ctx), self.sizes.workload_timeout_s + 120)
                        except (Exception, TimeoutError) as exc:  # noqa: BLE001 - shown in the table
                            msg = f"{type(exc).__name__}: {exc}".strip()
                            self._mark(system.name, names, "error", msg[:300])
                            self.say(f"[{system.name}] {names[0]}: error {msg[:300]}")
                            if os.environ.get("BENCH_TRACEBACK"):
                                traceback.print_exc()
                            continue
                        for row in rows:
                            self.report.add(row)
                        self.say(f"[{system.name}] {names[0]}: {rows[0].value:,.3f} {rows[0].unit} "
                                 f"({time.monotonic() - t1:.1f}s)")
            finally:
                await system.stop()
        info["seconds"] = round(time.monotonic() - t0, 1)
