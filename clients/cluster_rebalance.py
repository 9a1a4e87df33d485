"""``upr cluster rebalance`` / ``add NODE`` / ``remove NODE``: spread partitions by takeover,
followed to the end.

How a node joins: it starts with ``upr server --cluster ... --node NAME`` and is then up but
holds nothing (a cluster whose map is placed gives a new node no partition on its own: moving
data is the operator's decision, as in Couchbase, where an added server takes nothing until
the rebalance); ``upr cluster add NAME`` (or any ``rebalance``) then moves its share to it, the
data streaming to it as a replica first, so a node with an empty data dir is filled this way.
``upr cluster remove NAME`` moves every copy it holds to the others; once done it is out of
the map, gets no new copy, and may be stopped.

The request goes to any node (``--server``), the orchestrator carries it out; the command polls
``GET /cluster/rebalance`` and prints a progress line per change (partitions moved / remaining,
items transferred, takeovers), then exits 0 when the run is done.  It exits 1 with one error
line when the orchestrator refuses (a node down, a partition without active).  ``--no-wait``
returns after starting it; Ctrl-C or ``--stop`` stops it (moves in flight wind down, what moved
stays moved) and running it again resumes from there.
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

__all__ = ["progress_line", "run_rebalance", "RebalanceFailed", "register"]


class RebalanceFailed(UprError):
    code = "rebalance_failed"


def progress_line(status: dict[str, Any]) -> str:
    """One line for people: where the run stands."""
    request = status["request"]
    if request is not None and not request["planned"]:
        return "rebalance: planning"
    if request is not None and request.get("waiting"):
        return f"rebalance: waiting: {request['waiting']}"
    takeovers = ", ".join(f"{m['partition']} {m['source']}->{m['target']}"
                          + (f" (writes paused at seqno {m['fenced_at']})" if m["fenced_at"] is not None else "")
                          for m in status["takeovers"])
    building = sum(1 for c in status["building"] if not c["in_sync"])
    return (f"rebalance: {status['moved']}/{status['total']} partition(s) moved, {status['remaining']} remaining, "
            f"{status['transferred']} item(s) transferred, {building} copy(ies) catching up"
            + (f"; takeovers: {takeovers}" if takeovers else "") + f" (map revision {status['map_revision']})")


def run_rebalance(api: HttpApi, *, remove: tuple[str, ...] = (), add: tuple[str, ...] = (), wait: bool = True,
                  timeout: float = 600.0, poll_s: float = 0.2, say: Callable[[str], None] = print) -> int:
    """Start a run and (with ``wait``) follow it to its end; the exit status (errors are raised)."""
    status = api.start_rebalance(remove=remove, add=add)
    run = status["request"]["id"]
    say(f"rebalance {run} started" + (f", removing {', '.join(remove)}" if remove else "")
        + (f", adding {', '.join(add)}" if add else ""))
    if not wait:
        return EXIT_OK
    deadline = time.monotonic() + timeout
    last_line = ""
    try:
        while True:
            request = status["request"]
            if request is not None and request["id"] == run and request["refused"]:
                api.stop_rebalance()
                raise RebalanceFailed(f"rebalance refused: {request['refused']}")
            if request is None or request["id"] != run:
                return _ended(status, run, say)
            line = progress_line(status)
            if line != last_line:
                say(line)
                last_line = line
            if time.monotonic() > deadline:
                api.stop_rebalance()
                raise RebalanceFailed(f"rebalance did not finish within {timeout:g}s ({status['moved']} of "
                                      f"{status['total']} partition(s) moved; stopped, run it again to resume)")
            time.sleep(poll_s)
            status = api.rebalance_status()
    except KeyboardInterrupt:
        api.stop_rebalance()
        say("rebalance stopping: moves in flight wind down; run it again to resume")
        raise


def _ended(status: dict[str, Any], run: str, say: Callable[[str], None]) -> int:
    last = status["last"]
    if last is None or last.get("id") != run:
        raise RebalanceFailed("the rebalance ended without an outcome (another operator replaced or stopped it)")
    if last["result"] != "done":
        raise RebalanceFailed(f"the rebalance was stopped after {last.get('moved', 0)} of {last.get('total')} "
                              f"partition(s) moved; run it again to resume")
    say(f"rebalance done: {last.get('moved', 0)} partition(s) moved, {last.get('transferred', 0)} item(s) "
        f"transferred (map revision {status['map_revision']})")
    return EXIT_OK


def _api(args: argparse.Namespace) -> HttpApi:
    return HttpApi(args.server or default_server(), args.token if args.token is not None else default_token())


def _run(args: argparse.Namespace, *, remove: tuple[str, ...] = (), add: tuple[str, ...] = ()) -> int:
    try:
        with _api(args) as api:
            if getattr(args, "stop", False):
                status = api.stop_rebalance()
                print("rebalance stopping: moves in flight wind down" if status["request"] else "no rebalance running")
                return EXIT_OK
            return run_rebalance(api, remove=remove, add=add, wait=not args.no_wait, timeout=args.timeout)
    except UprError as exc:
        print(f"upr: error: {exc.message}", file=sys.stderr)
        return EXIT_ERROR if isinstance(exc, RebalanceFailed) else exit_code(exc)
    except KeyboardInterrupt:
        return 130


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=None, metavar="URL[,URL...]",
                   help="any node's base URL (default: $UPR_SERVER or http://127.0.0.1:8000)")
    p.add_argument("--token", default=None, help="bearer token with the admin role (default: $UPR_TOKEN)")
    p.add_argument("--no-wait", action="store_true", help="start it and return (follow it with `rebalance`'s status)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="stop it (what moved stays moved) after this long (default 600)")


def register(commands: Any) -> None:
    """Add ``rebalance``, ``add`` and ``remove`` to ``upr cluster``'s subcommands."""
    p = commands.add_parser("rebalance", help="move partitions by takeover until every node holds its share "
                                              "(blocks until done; Ctrl-C or --stop stops, running again resumes)")
    _common(p)
    p.add_argument("--stop", action="store_true", help="stop the rebalance in progress")
    p.set_defaults(func=lambda args: _run(args))
    p = commands.add_parser("add", help="give an up node (started with --cluster, holding nothing) its share "
                                        "of partitions by rebalance")
    p.add_argument("node", metavar="NODE")
    _common(p)
    p.set_defaults(func=lambda args: _run(args, add=(args.node,)))
    p = commands.add_parser("remove", help="move every copy a node holds to the others (graceful); it may then "
                                           "be stopped")
    p.add_argument("node", metavar="NODE")
    _common(p)
    p.set_defaults(func=lambda args: _run(args, remove=(args.node,)))
