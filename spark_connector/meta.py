"""Driver-side metadata: partition high seqnos, purge seqnos and failover logs in one round trip, and
the rollback check of held positions against them with the server's own rule (``engine.rollback``;
the same decision ``POST /positions/check`` and stream requests answer with).

An unreachable or refusing server is reported as an ``OptionError`` on ``server`` (or ``token``),
so a misconfigured query fails at its first planning step with a message naming the option.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clients.errors import AuthFailed, ConnectionFailed, HttpError
from clients.http import HttpApi
from engine.errors import SeqnoRangeError
from engine.rollback import Rollback, StreamPosition, decide
from engine.types import FailoverEntry

from .offsets import PartitionOffset
from .options import OptionError, SourceOptions
from .progress import RollbackNeeded, ServerMeta, ServerPartition


def fetch_meta(opts: SourceOptions) -> ServerMeta:
    """One round trip: every partition's high/purge seqno and failover log (``GET /partitions``)."""
    try:
        with HttpApi(opts.server, opts.token, timeout=opts.timeout) as api:
            return parse_meta({"partitions": api.partitions()})
    except ConnectionFailed as exc:
        raise OptionError("server", str(exc)) from None
    except AuthFailed as exc:
        raise OptionError("token", f"{exc} (the token is missing or lacks the read role)") from None
    except HttpError as exc:
        raise OptionError("server", str(exc)) from None


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
