"""Driver-side metadata calls: partition high seqnos, purge seqnos and failover logs in one round trip,
and the server's own rollback check for held positions.

An unreachable or refusing server is reported as an ``OptionError`` on ``server`` (or ``token``),
so a misconfigured query fails at its first planning step with a message naming the option.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from engine.rollback import Rollback, StreamPosition, decide
from engine.errors import SeqnoRangeError
from engine.types import FailoverEntry

from .offsets import PartitionOffset
from .options import OptionError, SourceOptions
from .progress import RollbackNeeded, ServerMeta, ServerPartition


def _headers(opts: SourceOptions) -> dict[str, str]:
    return {"Authorization": f"Bearer {opts.token}"} if opts.token else {}


def _call(opts: SourceOptions, method: str, path: str, **kw: Any) -> httpx.Response:
    try:
        resp = httpx.request(method, opts.server + path, headers=_headers(opts), timeout=opts.timeout, **kw)
    except httpx.HTTPError as exc:
        raise OptionError("server", f"cannot reach {opts.server}{path}: {exc!s} "
                                    f"({type(exc).__name__})") from None
    if resp.status_code in (401, 403):
        raise OptionError("token", f"{opts.server}{path} answered {resp.status_code}: "
                                   "the token is missing or lacks the read role")
    return resp


def fetch_meta(opts: SourceOptions) -> ServerMeta:
    resp = _call(opts, "GET", "/partitions")
    if resp.status_code != 200:
        raise OptionError("server", f"GET {opts.server}/partitions answered {resp.status_code}: {resp.text[:200]}")
    return parse_meta(resp.json())


def parse_meta(body: Mapping[str, Any]) -> ServerMeta:
    parts = {}
    for raw in body["partitions"]:
        log = tuple((int(e["uuid"]), int(e["seqno"])) if isinstance(e, Mapping) else (int(e[0]), int(e[1]))
                    for e in raw.get("failover_log", ()))
        pid = int(raw["partition"])
        parts[pid] = ServerPartition(pid, int(raw["high_seqno"]), int(raw.get("purge_seqno", 0)), log,
                                     str(raw.get("state", "active")))
    return ServerMeta(len(parts), parts)


def local_check(pos: PartitionOffset, sp: ServerPartition) -> RollbackNeeded | None:
    """The server's rule (engine.rollback.decide) applied to a held position and fetched metadata."""
    log = [FailoverEntry(u, s) for u, s in sp.failover_log]
    try:
        verdict = decide(log, sp.high_seqno, sp.purge_seqno,
                         StreamPosition(pos.uuid, pos.seqno, pos.snap_start, pos.snap_end))
    except SeqnoRangeError as exc:
        # Only a corrupt position gets here (the rules passed but it is past the high seqno):
        # nothing it holds can be trusted.
        return RollbackNeeded(0, f"range_error: {exc.message}")
    if isinstance(verdict, Rollback):
        return RollbackNeeded(verdict.seqno, verdict.reason.value)
    return None


def server_check(opts: SourceOptions, positions: Mapping[int, PartitionOffset]) -> dict[int, RollbackNeeded | None] | None:
    """Ask ``POST /positions/check`` (same rule, same reasons, no stream opened); None when the
    server has no such endpoint, so the caller falls back to ``local_check``."""
    body = {"positions": {str(p): {"uuid": o.uuid, "seqno": o.seqno, "snap_start": o.snap_start,
                                   "snap_end": o.snap_end} for p, o in positions.items()}}
    resp = _call(opts, "POST", "/positions/check", json=body)
    if resp.status_code in (404, 405):
        return None
    if resp.status_code != 200:
        raise OptionError("server", f"POST /positions/check answered {resp.status_code}: {resp.text[:200]}")
    out: dict[int, RollbackNeeded | None] = {}
    for key, verdict in _verdicts(resp.json()).items():
        if verdict.get("status") == "rollback":
            out[int(key)] = RollbackNeeded(int(verdict.get("rollback_seqno", 0)), str(verdict.get("reason")))
        elif verdict.get("status") == "ok":
            out[int(key)] = None
        else:
            out[int(key)] = RollbackNeeded(0, f"{verdict.get('status')}: {verdict.get('detail', '')}")
    return out


def _verdicts(body: Any) -> Mapping[str, Mapping[str, Any]]:
    results = body.get("results", body.get("partitions", body)) if isinstance(body, Mapping) else body
    if isinstance(results, list):
        return {str(r["partition"]): r for r in results}
    return results
