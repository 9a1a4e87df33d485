"""``upr cluster failover NODE``: graceful failover, followed to its end.

The request goes to any node (``--server``), the orchestrator carries it out; the command polls
``GET /cluster/failover/NODE`` and prints a line per step (a partition's writes stopped at a
seqno, a partition active elsewhere), then exits 0 once the node is active for nothing.  It
exits 1 with one error line when the orchestrator refuses (the reason: no in-sync replica,
unknown or down node) or when ``--timeout`` passes; on a timeout (or Ctrl-C) it withdraws the
request, so partitions not yet handed over take writes on the node again.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from engine.core.errors import UprError

from .cli_support import EXIT_ERROR, EXIT_OK, exit_code
from .http import HttpApi, default_server, default_token

__all__ = ["progress_lines", "run_failover", "register"]


def progress_lines(node: str, before: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What changed between two statuses, one line per step, for people."""
    lines = []
    if before is None:
        lines.append(f"graceful failover of {node}: {len(now['active'])} active partition(s) to hand over")
    was_fenced = {h["partition"] for h in (before or {}).get("handovers", []) if h["fenced_at"] is not None}
    for h in now["handovers"]:
        if h["fenced_at"] is not None and h["partition"] not in was_fenced:
            lines.append(f"partition {h['partition']}: writes stopped on {node} at seqno {h['fenced_at']}; "
                         f"{h['target']} receiving the rest")
    if before is not None:
        targets = {int(p): active for p, active in now.get("replica_of", {}).items()}
        for p in sorted(set(before["active"]) - set(now["active"])):
            where = f"active on {targets[p]}" if targets.get(p) else "active elsewhere"
            lines.append(f"partition {p}: {where} (map revision {now['map_revision']}); "
                         f"{node} {'stays its replica' if p in targets else 'holds no copy'}")
    return lines


def run_failover(api: HttpApi, node: str, *, force: bool, timeout: float, poll_s: float = 0.2,
                 say: Callable[[str], None] = print) -> int:
    """Start the failover and follow it; the exit status (errors are printed by the caller)."""
    status = api.start_failover(node, force=force)
    total = len(status["active"])
    for line in progress_lines(node, None, status):
        say(line)
    deadline = time.monotonic() + timeout
    try:
        while True:
            request = status["request"]
            if request is not None and request["refused"]:
                api.withdraw_failover(node)
                raise FailoverFailed(f"graceful failover of {node} refused: {request['refused']}")
            if request is None and not status["active"]:
                say(f"{node} is active for no partition (map revision {status['map_revision']})")
                return EXIT_OK
            if time.monotonic() > deadline:
                api.withdraw_failover(node)
                done = total - len(status["active"])
                raise FailoverFailed(f"graceful failover of {node} did not finish within {timeout:g}s ({done} of "
                                     f"{total} partition(s) handed over; the others take writes on {node} again)")
            time.sleep(poll_s)
            now = api.failover_status(node)
            for line in progress_lines(node, status, now):
                say(line)
            status = now
    except KeyboardInterrupt:
        api.withdraw_failover(node)
        raise


class FailoverFailed(UprError):
    code = "failover_failed"


def _cmd_failover(args: argparse.Namespace) -> int:
    token = args.token if args.token is not None else default_token()
    try:
        with HttpApi(args.server or default_server(), token) as api:
            return run_failover(api, args.node, force=args.force, timeout=args.timeout)
    except UprError as exc:
        print(f"upr: error: {exc.message}", file=sys.stderr)
        return exit_code(exc) if not isinstance(exc, FailoverFailed) else EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def register(commands: Any) -> None:
    """Add ``failover`` to ``upr cluster``'s subcommands."""
    p = commands.add_parser("failover", help="hand a live node's active partitions to in-sync replicas, losing "
                                             "no write (graceful failover)")
    p.add_argument("node", metavar="NODE")
    p.add_argument("--server", default=None, metavar="URL[,URL...]",
                   help="any node's base URL (default: $UPR_SERVER or http://127.0.0.1:8000)")
    p.add_argument("--token", default=None, help="bearer token with the admin role (default: $UPR_TOKEN)")
    p.add_argument("--force", action="store_true",
                   help="hand a partition to a replica still catching up (its writes stay paused until it has "
                        "caught up) instead of refusing")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="give up (and let the rest take writes again) after this long (default 120)")
    p.set_defaults(func=_cmd_failover)
