"""Driver-side metadata: partition high seqnos, purge seqnos and failover logs in one round trip, and
the rollback check of held positions against them with the server's own rule (``engine.core.rollback``;
the same decision ``POST /positions/check`` and stream requests answer with).

An unreachable or refusing server is reported as an ``OptionError`` on ``server`` (or ``token``),
so a misconfigured query fails at its first planning step with a message naming the option.

The one request goes through the standard library, not ``clients.http``: Spark starts the
driver's streaming-source process afresh for every query, and importing the ``clients`` package
(httpx and the consumer stack) is a visible share of every ``upr index run`` (see
docs/benchmarks.md, Spark: the per-run cost notes).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.core.errors import SeqnoRangeError
from engine.core.rollback import MustRollBack, StreamPosition, decide
from engine.core.types import FailoverEntry

from .cuts import resume_position
from .offsets import PartitionOffset
from .options import OptionError, SourceOptions
from .progress import RollbackNeeded, ServerMeta, ServerPartition


def fetch_meta(opts: SourceOptions) -> ServerMeta:
    """One round trip: every partition's high/purge seqno and failover log (``GET /partitions``)."""
    return parse_meta(get_json(opts.server, "/partitions", opts.token, opts.timeout))


def get_json(server: str, path: str, token: str | None, timeout: float) -> Any:
    """``GET server+path`` as JSON; failures become ``OptionError`` on ``server`` or ``token``."""
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
        if exc.code in (401, 403):
            raise OptionError("token", f"{message} (the token is missing or lacks the read role)") from None
        raise OptionError("server", message) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc or type(exc).__name__
        raise OptionError("server", f"GET {path}: cannot reach {server}: {reason}") from None


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
