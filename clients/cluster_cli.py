"""``upr cluster status``: the cluster's nodes, partition map and moves in progress, as a table or
``--json`` (``upr cluster failover`` lives in ``clients.cluster_failover``, ``rebalance``/``add``/
``remove`` in ``clients.cluster_rebalance``).

A replica's lag is known on the node active for its partition (it holds the high seqno), so the
command asks every node that is up and takes each partition's lag from its active's answer; a
node that does not answer leaves its partitions' lag unknown (``-``) rather than failing the
command.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from engine.core.errors import UprError

from .cli_support import EXIT_OK, exit_code
from .http import HttpApi, default_server, default_token


def cluster_status(server: str, token: str | None) -> dict[str, Any]:
    """``GET /cluster`` from ``server``, with every replica's lag filled in from its active's node."""
    with HttpApi(server, token) as api:
        view = api.cluster()
    lags: dict[tuple[int, str], int | None] = {}
    for node in view["nodes"]:
        if node["state"] != "up" or not node["url"]:
            continue
        try:
            with HttpApi(node["url"], token) as api:
                theirs = api.cluster()
        except UprError:
            continue
        for entry in theirs["map"]["partitions"]:
            if entry["active"] == node["name"]:
                for replica in entry["replicas"]:
                    lags[(entry["partition"], replica["node"])] = replica["lag"]
    for entry in view["map"]["partitions"]:
        for replica in entry["replicas"]:
            replica["lag"] = lags.get((entry["partition"], replica["node"]), replica["lag"])
    return view


def render(view: dict[str, Any]) -> str:
    lines = [f"map revision {view['map']['revision']}  orchestrator {view['orchestrator'] or '-'}"
             f"  (answered by {view['node']}{', fenced' if view['fenced'] else ''})", "",
             f"{'node':<16} {'state':<6} url"]
    lines += [f"{n['name']:<16} {n['state']:<6} {n['url'] or '-'}" for n in view["nodes"]]
    lines += ["", f"{'part':>4} {'active':<16} replicas (seqno, sync, lag)"]
    for entry in view["map"]["partitions"]:
        replicas = ", ".join(
            f"{r['node']} ({'-' if r['seqno'] is None else r['seqno']}, {'in sync' if r['in_sync'] else 'catching up'}, "
            f"lag {'-' if r['lag'] is None else r['lag']})" for r in entry["replicas"]) or "-"
        lines.append(f"{entry['partition']:>4} {entry['active'] or '(none)':<16} {replicas}")
    return "\n".join(lines)


def _cmd_status(args: argparse.Namespace) -> int:
    server, token = args.server or default_server(), args.token if args.token is not None else default_token()
    try:
        view = cluster_status(server, token)
        with HttpApi(server, token) as api:
            view["rebalance"] = api.rebalance_status()
    except UprError as exc:
        print(f"upr: error: {exc.message}", file=sys.stderr)
        return exit_code(exc)
    if args.json:
        sys.stdout.write(orjson.dumps(view, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render(view))
        print(render_moves(view["rebalance"]))
    return EXIT_OK


def render_moves(status: dict[str, Any]) -> str:
    """The rebalance in progress (``GET /cluster/rebalance``), or that none is."""
    from .cluster_rebalance import progress_line

    lines = [""]
    request = status["request"]
    if request is None:
        lines.append("no rebalance in progress")
    elif request["refused"]:
        lines.append(f"rebalance refused: {request['refused']}")
    else:
        lines.append(progress_line(status) + (" (stopping)" if request["stopped"] else ""))
        lines += [f"  copy of partition {c['partition']} on {c['node']}: seqno {c['seqno'] if c['seqno'] is not None else '-'}"
                  f", {'in sync' if c['in_sync'] else 'catching up'}" for c in status["building"]]
    if status["removed"]:
        lines.append(f"removed nodes (no new copy goes there): {', '.join(status['removed'])}")
    return "\n".join(lines)


def register(sub: Any) -> None:
    """Add ``upr cluster ...`` to ``upr``'s subparsers."""
    group = sub.add_parser("cluster", help="the cluster's nodes and partition map (servers run with --cluster)")
    commands = group.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND")
    p = commands.add_parser("status", help="nodes, the partition map and each replica's progress")
    p.add_argument("--server", default=None, metavar="URL",
                   help="any node's base URL (default: $UPR_SERVER or http://127.0.0.1:8000)")
    p.add_argument("--token", default=None, help="bearer token (default: $UPR_TOKEN)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_status)

    from .cluster_failover import register as register_failover
    from .cluster_rebalance import register as register_rebalance

    register_failover(commands)
    register_rebalance(commands)
