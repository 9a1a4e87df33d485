"""``python -m bench``: run the suite, print the table, write the JSON.

Fast mode is the default (small sizes, the whole run in under two minutes, what the test suite
runs); ``--full`` is the size the figures in docs/benchmarks.md come from (``make bench``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import asyncio
import signal
import sys
from pathlib import Path

from bench.suite.install import InstallLog
from bench.suite.procs import stop_everything
from bench.suite.results import Report
from bench.suite.runner import FEED_WORKLOADS, Runner, all_systems
from bench.suite.sizes import FAST, FULL, Sizes

DEFAULT_JSON = Path(__file__).resolve().parent.parent / "results.json"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--full", action="store_true", help="full sizes (1e6 backfill, 20 s tails, 50 consumers)")
    p.add_argument("--systems", default="upr,upr-memory,upr-clients,redis,nats,postgres",
                   help="comma-separated subset of upr,upr-memory,upr-clients,redis,nats,postgres (default all)")
    p.add_argument("--workloads", default=",".join([*FEED_WORKLOADS, "limits"]),
                   help="comma-separated subset of ingest,backfill,tail,fanout,limits (default all)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    p.add_argument("--no-install", action="store_true", help="never apt-get/pip install; missing peers are skipped")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds after which remaining workloads are skipped (default 100 fast, 3600 full)")
    p.add_argument("--set", action="append", default=[], metavar="SIZE=VALUE",
                   help="override one size of the chosen mode, e.g. --set backfill_n=200000 (see bench/suite/sizes.py)")
    p.add_argument("--table-from", type=Path, metavar="RESULTS.json",
                   help="only print the table of an earlier run's results file (runs nothing)")
    p.add_argument("--no-notes", action="store_true", help="leave the notes column out of the table")
    p.add_argument("--keep-logs", action="store_true", help="copy peer and consumer logs to a kept temp dir")
    return p.parse_args(argv)


def override(sizes: Sizes, assignments: list[str]) -> Sizes:
    """``sizes`` with ``name=value`` assignments applied (tuples as comma-separated values)."""
    changes: dict[str, object] = {}
    for item in assignments:
        name, sep, raw = item.partition("=")
        current = getattr(sizes, name, None) if sep else None
        if current is None or name == "mode":
            raise ValueError(f"{item!r}: expected NAME=VALUE with NAME one of {sorted(sizes.as_dict())}")
        if isinstance(current, tuple):
            if current and isinstance(current[0], tuple):
                raise ValueError(f"{name} cannot be set from the command line")
            changes[name] = tuple(int(v) for v in raw.split(","))
        else:
            changes[name] = type(current)(raw)
    return dataclasses.replace(sizes, **changes) if changes else sizes


def _interrupted(_signum: int, _frame: object) -> None:
    """SIGINT/SIGTERM: stop every process we started right here, then unwind."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second ^C must not cut the cleanup short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_everything()
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.table_from is not None:
        print(Report.from_json(json.loads(args.table_from.read_text())).table(notes=not args.no_notes))
        return 0
    sizes = FULL if args.full else FAST
    try:
        sizes = override(sizes, args.set)
    except (ValueError, TypeError) as exc:
        print(f"--set: {exc}", file=sys.stderr)
        return 2
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(workloads) - {*FEED_WORKLOADS, "limits"}
    systems = [s for s in all_systems() if s.name in wanted]
    if unknown or len(systems) != len(set(wanted)):
        print(f"unknown workloads {sorted(unknown)} or systems in {wanted}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)  # also when started with SIGINT ignored (`&` in a script)
    budget = args.budget if args.budget is not None else (100.0 if sizes is FAST else 3600.0)
    runner = Runner(sizes, InstallLog(allow=not args.no_install), workloads, budget, keep_dir=args.keep_logs,
                    say=lambda m: print(m, file=sys.stderr, flush=True))
    try:
        report = asyncio.run(runner.run(systems))
    except KeyboardInterrupt:
        stop_everything()
        print("interrupted: every process the suite started has been stopped", file=sys.stderr)
        return 130
    print(report.table(notes=not args.no_notes))
    report.write_json(args.json)
    m = report.meta
    print(f"\n{m['started']} .. {m['finished']}, load average {m['loadavg_start']} .. {m['loadavg_end']} "
          f"on {m['host']['cpus']} CPUs; results written to {args.json}", file=sys.stderr)
    return 0
