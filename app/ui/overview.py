"""What ``GET /ui/api/overview`` answers: one JSON document with everything the console draws.

WHY one document: the page refreshes every second, and one request a second per open page (the
same numbers ``/status``, ``/partitions``, ``/streams`` and ``/cluster`` give, read at one
moment) is cheaper for the node and easier to keep consistent than four.  Field names follow those
endpoints, so the page's numbers can be checked against them.
"""
from __future__ import annotations

import time
from typing import Any

from app.cluster.replication import is_replication
from app.ui.monitor import NodeMonitor, Reading, node_name


def _stream_rows(app: Any) -> list[dict[str, Any]]:
    """Open streams with per-partition lag in seqnos (the partition's high seqno minus the last
    seqno sent) and in seconds.

    Lag in seconds is how long the oldest change the stream has not yet delivered has waited
    (the connection's own record of when it was notified); null when the stream is behind
    without a pending notification (reading history from disk), where no change time is known."""
    now = time.monotonic()
    engine = app.state.runner.engine if app.state.runner is not None else None
    rows = []
    registry = app.state.streams
    # both walk the registry in connection order, with no await between them
    for handle, s in zip(list(registry), registry.statuses()):
        notified_at = getattr(handle, "notified_at", None)
        notified: dict[int, float] = notified_at() if callable(notified_at) else {}
        parts = []
        for p in s.partitions:
            # behind the partition's high seqno, not only the snapshot being sent: a stalled
            # consumer that never got to a partition is as far behind as its writes
            lag = max(p.lag, engine.high_seqno(p.partition) - p.last_sent_seqno if engine is not None else 0)
            since = notified.get(p.partition)
            lag_s = round(max(0.0, now - since), 3) if since is not None and lag > 0 else (0.0 if lag == 0 else None)
            parts.append({"partition": p.partition, "last_sent_seqno": p.last_sent_seqno, "lag": lag, "lag_s": lag_s,
                          "purge_seqno": p.purge_seqno, "purge_distance": p.purge_distance})
        rows.append({
            "id": s.id, "name": s.name, "kind": "replication" if is_replication(s.name) else "consumer",
            "remote": s.remote, "codec": s.codec, "connected_at": s.connected_at, "window_bytes": s.window_bytes,
            "bytes_buffered": s.bytes_buffered, "barriers_pending": s.barriers_pending, "rollbacks": s.rollbacks,
            "cursor_drops": s.cursor_drops, "partitions": parts,
        })
    return rows


def build_overview(app: Any, monitor: NodeMonitor, reading: Reading) -> dict[str, Any]:
    counters = reading.counters
    stats = reading.stats
    engine = monitor._engine  # noqa: SLF001 - the monitor's engine is the node's
    return {
        "node": node_name(app, engine),
        "node_id": str(engine.node_id),
        "time": reading.wall,
        "uptime_s": round(time.monotonic() - app.state.started_at, 1),
        "partition_count": len(stats),
        "protected_mode": app.state.tokens.protected_mode,
        "totals": {
            "items": sum(s.item_count for s in stats),
            "high_seqno": sum(s.high_seqno for s in stats),
            "persisted_seqno": sum(s.persisted_seqno for s in stats),
            "queue_depth": sum(s.queue_depth for s in stats),
            "queue_bytes": sum(s.queue_bytes for s in stats),
            "queue_memory_limit_bytes": counters.get("queue_memory_limit_bytes", 0),
            "writes_total": counters.get("writes_total", 0),
            "flush_count": counters.get("flush_count", 0),
            "flush_errors_total": counters.get("flush_errors_total", 0),
            "streams_connected": len(app.state.streams),
        },
        "flush_fault": reading.flush_fault,
        "history": monitor.history.series(),
        "partitions": [
            {"partition": s.partition, "state": s.state.value, "uuid": str(s.uuid), "high_seqno": s.high_seqno,
             "persisted_seqno": s.persisted_seqno, "purge_seqno": s.purge_seqno, "item_count": s.item_count,
             "queue_depth": s.queue_depth, "queue_bytes": s.queue_bytes,
             "failover_log": [[str(e.uuid), e.seqno] for e in s.failover_log]}
            for s in stats
        ],
        "streams": _stream_rows(app),
        "cluster": reading.cluster,
        "events_last_id": monitor.events.last_id,
    }
