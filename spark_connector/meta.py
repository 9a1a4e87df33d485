"""Driver-side metadata: partition high seqnos, purge seqnos and failover logs in one round trip, and
the rollback check of held positions against them with the server's own rule (``engine.core.rollback``;
the same decision ``POST /positions/check`` and stream requests answer with).

A refusing server is reported as an ``OptionError`` on ``server`` (or ``token``), so a
misconfigured query fails at its first planning step naming the option; an unreachable one is
retried (``spark_connector.retry``) and then reported as ``SourceUnavailable`` naming the cause.

The one request goes through the standard library, not ``clients.http``: Spark starts the
driver's streaming-source process afresh for every query, and importing the ``clients`` package
(httpx and the consumer stack) is a visible share of every ``upr index run`` (see
docs/benchmarks.md, Spark: the per-run cost notes).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from engine.core.errors import SeqnoRangeError
from engine.core.rollback import MustRollBack, StreamPosition, decide
from engine.core.types import FailoverEntry

from engine.protocol.client.routing import MapView

from .cluster_map import NoActiveNode, parse_map, split_routes
from .cuts import resume_position
from .offsets import PartitionOffset
from .options import OptionError, SourceOptions
from .progress import RollbackNeeded, ServerMeta, ServerPartition
from .retry import Retryable, call_with_retries

log = logging.getLogger(__name__)


def fetch_meta(opts: SourceOptions) -> ServerMeta:
    """Every partition's high/purge seqno and failover log, retried as ``fetchOffset.numRetries``
    / ``fetchOffset.retryIntervalMs`` allow (see ``fetch_routed``)."""
    return fetch_routed(opts)[0]


def fetch_routed(opts: SourceOptions, *, partial: bool = False) -> tuple[ServerMeta, dict[int, str] | None]:
    """The metadata and, on a cluster, each partition's active node URL (None: a single server).

    A single server is one round trip (``GET /partitions``) after ``GET /cluster`` answered 404.
    On a cluster each partition's entry comes from its active node (a replica's high seqno lags,
    and a dead copy's history may have branched off).  A partition whose map names no live
    active, whose active cannot be reached, or whose node does not hold it active yet (it has not
    read the new map) is retried; with ``partial`` (a streaming query's trigger) only while no
    partition at all can be read: otherwise it goes into ``ServerMeta.unavailable``, so the
    others keep flowing and the next trigger tries it again, as a consumer does."""
    seeds = opts.seeds
    return call_with_retries(f"GET /partitions from {','.join(seeds)}", lambda: routed_once(opts, partial),
                             opts.retry)


def read_map(servers: tuple[str, ...], token: str | None, timeout: float) -> tuple[str, MapView | None]:
    """``GET /cluster`` from the first server that answers: (that server, its map), or (it, None)
    when it is a single server (404: not in a cluster).  ``Retryable`` when none answers."""
    causes = []
    for server in servers:
        try:
            return server, parse_map(get_once(server, "/cluster", token, timeout))
        except OptionError as exc:
            if "HTTP 404" in str(exc):
                return server, None
            raise
        except Retryable as exc:
            causes.append(str(exc))
    if len(causes) == 1:
        raise Retryable(causes[0])
    raise Retryable("no node answered GET /cluster: " + "; ".join(causes))


def routed_once(opts: SourceOptions, partial: bool = False) -> tuple[ServerMeta, dict[int, str] | None]:
    """One attempt of ``fetch_routed``."""
    server, view = read_map(opts.seeds, opts.token, opts.timeout)
    if view is None:
        return parse_meta(get_once(server, "/partitions", opts.token, opts.timeout)), None
    routes, unserved = split_routes(view, view.actives)
    parts: dict[int, ServerPartition] = {}
    for url in sorted(set(routes.values())):
        mine = [p for p, node_url in routes.items() if node_url == url]
        try:
            answer = parse_meta(get_once(url, "/partitions", opts.token, opts.timeout))
        except Retryable as exc:
            unserved.update({p: f"partition {p}: its active node {url} cannot be read ({exc})" for p in mine})
            continue
        for p in mine:
            sp = answer.partitions.get(p)
            if sp is None or sp.state != "active":
                unserved[p] = (f"partition {p}: node {url} is not active for it yet "
                               f"(map revision {view.revision}, state {sp.state if sp else 'unknown'})")
            else:
                parts[p] = sp
    if unserved and (not partial or not parts):
        raise NoActiveNode(unserved[min(unserved)] + (f" (and {len(unserved) - 1} more partitions)"
                                                      if len(unserved) > 1 else ""))
    if unserved:
        log.warning("partitions without a live active node, left where they are until the next "
                    "trigger: %s", "; ".join(unserved[p] for p in sorted(unserved)))
    routes = {p: u for p, u in routes.items() if p in parts}
    return ServerMeta(view.num_partitions, parts, dict(unserved)), routes


def get_json(server: str, path: str, token: str | None, timeout: float) -> Any:
    """``GET server+path`` as JSON, one attempt, for callers that can do without the answer:
    every failure is an ``OptionError`` on ``server`` or ``token``."""
    try:
        return get_once(server, path, token, timeout)
    except Retryable as exc:
        raise OptionError("server", f"GET {path}: cannot reach {server}: {exc}") from None


def get_once(server: str, path: str, token: str | None, timeout: float) -> Any:
    """``GET server+path`` as JSON.  Faults that may heal (unreachable, 5xx, a dropped or garbled
    answer) raise ``Retryable``; refusals raise ``OptionError`` on ``token`` (401/403) or ``server``."""
    import urllib.error
    import urllib.request
    url = server.rstrip("/") + path
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.reason
        try:
            body = json.loads(exc.read())
            if isinstance(body, dict):
                detail = body.get("detail") or body.get("title") or detail
        except ValueError:
            pass
        message = f"GET {path}: HTTP {exc.code}: {detail}"
        if exc.code >= 500:
            raise Retryable(f"HTTP {exc.code}: {detail}") from None
        if exc.code in (401, 403):
            raise OptionError("token", f"{message} (the token is missing or lacks the read role)") from None
        raise OptionError("server", message) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc or type(exc).__name__
        raise Retryable(f"cannot reach {server}: {reason}") from None


def parse_meta(body: Mapping[str, Any]) -> ServerMeta:
    parts = {}
    for raw in body["partitions"]:
        log = tuple((int(e["uuid"]), int(e["seqno"])) if isinstance(e, Mapping) else (int(e[0]), int(e[1]))
                    for e in raw.get("failover_log", ()))
        pid = int(raw["partition"])
        parts[pid] = ServerPartition(pid, int(raw["high_seqno"]), int(raw.get("purge_seqno", 0)), log,
                                     str(raw.get("state", "active")), int(raw.get("persisted_seqno", 0)))
    return ServerMeta(len(parts), parts)


def local_check(pos: PartitionOffset, sp: ServerPartition) -> RollbackNeeded | None:
    """The server's rule (engine.core.rollback.decide) applied to a held position and fetched metadata."""
    log = [FailoverEntry(u, s) for u, s in sp.failover_log]
    held = resume_position(pos, sp.uuid, sp.high_seqno)
    try:
        verdict = decide(log, sp.high_seqno, sp.purge_seqno,
                         StreamPosition(held.uuid, held.seqno, held.snap_start, held.snap_end))
    except SeqnoRangeError as exc:
        # Only a corrupt position gets here (the rules passed but it is past the high seqno):
        # nothing it holds can be trusted.
        return RollbackNeeded(0, f"range_error: {exc.message}")
    if isinstance(verdict, MustRollBack):
        return RollbackNeeded(verdict.seqno, verdict.reason.value)
    return None
